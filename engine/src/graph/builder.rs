//! Builder methods: declare inputs and parameters, and the helpers every op's constructor uses.
//! The constructors themselves (`Graph::rms_norm`, …: an op's operand checks and output shape
//! rule) live in the op's own module under `ops/`, as `impl Graph` blocks. Every one infers its
//! output shape and returns a [`GraphError`] naming the op and the operand shapes when they are
//! inconsistent, so a model that the engine cannot run fails when it is built, not when it runs.

use super::error::{fmt_shapes, GraphError};
use super::{ElemType, Graph, Op, Param, TensorId, TensorInfo, TensorKind};
use crate::DType;

pub(crate) type Result<T> = std::result::Result<T, GraphError>;

pub(crate) fn shape_err(
    op: &'static str,
    msg: impl Into<String>,
    named: &[(&str, &[usize])],
) -> GraphError {
    GraphError::Shape { op, msg: msg.into(), shapes: fmt_shapes(named) }
}

/// numpy broadcasting of `mask` against `full`, right-aligned, without growing `full`.
pub(crate) fn broadcastable(mask: &[usize], full: &[usize]) -> bool {
    mask.len() <= full.len()
        && mask.iter().rev().zip(full.iter().rev()).all(|(&m, &f)| m == 1 || m == f)
}

pub(crate) fn check_p(op: &'static str, p: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        return Err(GraphError::Attr {
            op,
            msg: format!("dropout probability {p} is outside [0, 1]"),
        });
    }
    Ok(())
}

impl Graph {
    // ---------------------------------------------------------------- declarations

    /// An integer input (token ids, labels, position ids), fed as i64 on every step.
    pub fn input_ids(&mut self, name: &str, shape: &[usize]) -> Result<TensorId> {
        self.input(name, shape, ElemType::I64)
    }

    /// A float input (e.g. an additive attention mask), fed as f32 on every step.
    pub fn input_float(&mut self, name: &str, shape: &[usize]) -> Result<TensorId> {
        self.input(name, shape, ElemType::Float(self.dtype))
    }

    fn input(&mut self, name: &str, shape: &[usize], elem: ElemType) -> Result<TensorId> {
        if self.inputs.iter().any(|&t| self.input_name(t) == Some(name)) {
            return Err(GraphError::Duplicate { kind: "input", name: name.to_string() });
        }
        let t = self.new_tensor(shape.to_vec(), elem, TensorKind::Input { name: name.to_string() });
        self.inputs.push(t);
        Ok(t)
    }

    /// Registers a parameter: `numel(shape)` elements of the flat parameter buffer, after the
    /// previous parameter at the next offset aligned to [`super::PARAM_ALIGN_ELEMS`].
    /// To tie weights, register once and use the returned tensor in both places.
    pub fn param(&mut self, name: &str, shape: &[usize]) -> Result<TensorId> {
        if self.param_by_name(name).is_some() {
            return Err(GraphError::Duplicate { kind: "parameter", name: name.to_string() });
        }
        let len: usize = shape.iter().product();
        if len == 0 {
            return Err(shape_err(
                "param",
                format!("parameter '{name}' has no elements"),
                &[("shape", shape)],
            ));
        }
        let t = self.new_tensor(
            shape.to_vec(),
            ElemType::Float(self.dtype),
            TensorKind::Param(self.params.len()),
        );
        let offset = self.num_param_elems.next_multiple_of(super::PARAM_ALIGN_ELEMS);
        self.params.push(Param {
            name: name.to_string(),
            shape: shape.to_vec(),
            offset,
            len,
            tensor: t,
        });
        self.num_param_elems = offset + len;
        Ok(t)
    }

    /// Marks the scalar the executor reports as the loss (autodiff also sets it).
    pub fn set_loss(&mut self, loss: TensorId) -> Result<()> {
        let (shape, _) = self.float_arg("loss", "loss", loss)?;
        if !shape.is_empty() {
            return Err(shape_err("loss", "the loss must be a scalar", &[("loss", &shape)]));
        }
        self.loss = Some(loss);
        Ok(())
    }

    /// HF `nn.Linear`: x · wᵀ (+ bias), w of shape (out, in).
    pub fn linear(&mut self, x: TensorId, w: TensorId, bias: Option<TensorId>) -> Result<TensorId> {
        let y = self.matmul(x, w, false, true)?;
        match bias {
            Some(b) => self.bias_add(y, b),
            None => Ok(y),
        }
    }

    /// HF's `repeat_kv` written with reshape and concat: x (B, Hkv, T, D) → (B, Hkv, 1, T·D)
    /// → concat of `n_rep` copies of that tensor along the last dim → (B, Hkv·n_rep, T, D), so
    /// head h of the result is head h / n_rep of x. `n_rep` = 1 returns x. `fuse_attention`
    /// sees through it: a fused attention reads x with Hkv heads.
    // x: (B, Hkv, T, D) -> (B, Hkv·n_rep, T, D)
    pub fn repeat_kv(&mut self, x: TensorId, n_rep: usize) -> Result<TensorId> {
        let op = "repeat_kv";
        let (sx, _) = self.float_arg(op, "x", x)?;
        if sx.len() != 4 || n_rep == 0 {
            return Err(shape_err(
                op,
                format!("x must be 4-D (B, Hkv, T, D) and n_rep >= 1, got n_rep={n_rep}"),
                &[("x", &sx)],
            ));
        }
        if n_rep == 1 {
            return Ok(x);
        }
        let (b, hkv, t, d) = (sx[0], sx[1], sx[2], sx[3]);
        let flat = self.reshape(x, &[b, hkv, 1, t * d])?;
        let rep = self.concat(&vec![flat; n_rep])?;
        self.reshape(rep, &[b, hkv * n_rep, t, d])
    }

    // ---------------------------------------------------------------- helpers

    pub(crate) fn info(&self, t: TensorId) -> Result<&TensorInfo> {
        self.tensors.get(t.index()).ok_or(GraphError::UnknownTensor(t))
    }

    /// The shape and dtype of a float operand, or a type error naming the op and argument.
    pub(crate) fn float_arg(
        &self,
        op: &'static str,
        arg: &'static str,
        t: TensorId,
    ) -> Result<(Vec<usize>, DType)> {
        let info = self.info(t)?;
        match info.elem {
            ElemType::Float(d) => Ok((info.shape.clone(), d)),
            other => Err(GraphError::Type {
                op,
                arg,
                expected: "a float tensor",
                got: format!("{other} {}", super::fmt_shape(&info.shape)),
            }),
        }
    }

    pub(crate) fn ids_arg(
        &self,
        op: &'static str,
        arg: &'static str,
        t: TensorId,
    ) -> Result<Vec<usize>> {
        let info = self.info(t)?;
        match info.elem {
            ElemType::I64 => Ok(info.shape.clone()),
            other => Err(GraphError::Type {
                op,
                arg,
                expected: "an i64 tensor",
                got: format!("{other} {}", super::fmt_shape(&info.shape)),
            }),
        }
    }

    pub(crate) fn unary(&mut self, name: &'static str, op: Op, x: TensorId) -> Result<TensorId> {
        let (sx, dt) = self.float_arg(name, "x", x)?;
        Ok(self.push(op, vec![x], vec![(sx, ElemType::Float(dt))])[0])
    }

    /// Two operands of the same shape → one output of that shape.
    pub(crate) fn binary_same(
        &mut self,
        name: &'static str,
        op: Op,
        args: [(&'static str, TensorId); 2],
    ) -> Result<TensorId> {
        let (s0, dt) = self.float_arg(name, args[0].0, args[0].1)?;
        let (s1, _) = self.float_arg(name, args[1].0, args[1].1)?;
        if s0 != s1 {
            return Err(shape_err(
                name,
                "operands must have the same shape",
                &[(args[0].0, &s0), (args[1].0, &s1)],
            ));
        }
        Ok(self.push(op, vec![args[0].1, args[1].1], vec![(s0, ElemType::Float(dt))])[0])
    }
}
