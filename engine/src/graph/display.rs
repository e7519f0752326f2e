//! Pretty-printing: one line per input, parameter and node, so passes can show a graph before and
//! after a rewrite:
//!
//! ```text
//! %0 = input "input_ids" (2,8) i64
//! %1 = param "wte.weight" (50,16) f32 @0+800
//! %7 = matmul(%3, %1) ta=false tb=true (2,8,50) f32
//! %9, %10, %11 = layernorm(%4, %2, %3) eps=1e-5 (2,8,16) f32, (2,8) f32, (2,8) f32
//! loss = %12
//! grad "wte.weight" = %30
//! ```

use super::{fmt_shape, Graph, TensorId, TensorKind};
use std::fmt;

impl Graph {
    /// `(2,8,50) f32`
    fn fmt_type(&self, t: TensorId) -> String {
        let info = self.tensor(t);
        format!("{} {}", fmt_shape(&info.shape), info.elem)
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &t in &self.inputs {
            let name = self.input_name(t).unwrap_or("?");
            writeln!(f, "{t} = input \"{name}\" {}", self.fmt_type(t))?;
        }
        for p in &self.params {
            writeln!(
                f,
                "{} = param \"{}\" {} @{}+{}",
                p.tensor,
                p.name,
                self.fmt_type(p.tensor),
                p.offset,
                p.len
            )?;
        }
        for n in &self.nodes {
            let outs: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
            let ins: Vec<String> = n.inputs.iter().map(|t| t.to_string()).collect();
            let types: Vec<String> = n.outputs.iter().map(|&t| self.fmt_type(t)).collect();
            let attrs = n.op.attrs();
            let sep = if attrs.is_empty() { "" } else { " " };
            let grad = match n.outputs.first().map(|&o| &self.tensor(o).kind) {
                Some(TensorKind::Grad(of)) => format!("  // d{of}"),
                _ => String::new(),
            };
            writeln!(
                f,
                "{} = {}({}){sep}{attrs} {}{grad}",
                outs.join(", "),
                n.op.name(),
                ins.join(", "),
                types.join(", ")
            )?;
        }
        if let Some(l) = self.loss {
            writeln!(f, "loss = {l}")?;
        }
        for (p, g) in self.params.iter().zip(&self.param_grads) {
            match g {
                Some(g) => writeln!(f, "grad \"{}\" = {g}", p.name)?,
                None => writeln!(f, "grad \"{}\" = 0", p.name)?,
            }
        }
        Ok(())
    }
}
