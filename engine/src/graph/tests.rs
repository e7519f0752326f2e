//! Builder shape inference, its errors, parameter layout and printing.

use super::*;
use crate::graph::op::{Attention, Dropout};

fn shape_error(r: Result<TensorId, GraphError>) -> (String, String) {
    match r {
        Err(GraphError::Shape { op, shapes, .. }) => (op.to_string(), shapes),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn parameters_get_aligned_offsets_in_the_flat_buffer() {
    let mut g = Graph::new();
    let a = g.param("a.weight", &[3, 4]).unwrap();
    let b = g.param("a.bias", &[4]).unwrap();
    let c = g.param("b.weight", &[2, 2, 2]).unwrap();
    let d = g.param("b.bias", &[3]).unwrap();
    let offs: Vec<(usize, usize)> = g.params().iter().map(|p| (p.offset, p.len)).collect();
    // 12 → padded to 16; 16 + 4 → 24; 24 + 8 = 32 is aligned already.
    assert_eq!(offs, [(0, 12), (16, 4), (24, 8), (32, 3)]);
    assert_eq!(g.num_param_elems(), 35);
    assert_eq!(g.param_count(), 27);
    assert_eq!(flat_offsets([12, 4, 8, 3]), (vec![0, 16, 24, 32], 35));
    assert_eq!(g.tensor(d).kind, TensorKind::Param(3));
    assert_eq!(g.param_by_name("a.bias").unwrap().tensor, b);
    assert_eq!(
        (g.tensor(a).kind.clone(), g.tensor(c).kind.clone()),
        (TensorKind::Param(0), TensorKind::Param(2))
    );
    assert!(matches!(g.param("a.bias", &[4]), Err(GraphError::Duplicate { .. })));
    assert!(g.input_ids("a.bias", &[1]).is_ok(), "inputs and params have separate names");
}

#[test]
fn infers_shapes() {
    let mut g = Graph::new();
    let ids = g.input_ids("ids", &[2, 5]).unwrap();
    let wte = g.param("wte", &[11, 8]).unwrap();
    let x = g.embedding(wte, ids).unwrap();
    assert_eq!(g.shape(x), [2, 5, 8]);
    let w = g.param("w", &[24, 8]).unwrap();
    let y = g.matmul(x, w, false, true).unwrap();
    assert_eq!(g.shape(y), [2, 5, 24]);
    let parts = g.split(y, &[8, 8, 8]).unwrap();
    assert_eq!(parts.len(), 3);
    let q = g.reshape(parts[0], &[2, 5, 2, 4]).unwrap();
    let q = g.permute(q, &[0, 2, 1, 3]).unwrap();
    assert_eq!(g.shape(q), [2, 2, 5, 4]);
    let kt = g.transpose(q, 2, 3).unwrap();
    let s = g.matmul(q, kt, false, false).unwrap();
    assert_eq!(g.shape(s), [2, 2, 5, 5]);
    let a = g.attention(q, q, q, AttentionOpts { causal: true, ..Default::default() }).unwrap();
    assert_eq!(g.shape(a), [2, 2, 5, 4]);
    let logits = g.matmul(x, wte, false, true).unwrap();
    let labels = g.input_ids("labels", &[2, 5]).unwrap();
    let loss = g.cross_entropy(logits, labels).unwrap();
    assert_eq!(g.shape(loss), [] as [usize; 0]);
    // Attention's default scale is 1/√D.
    assert!(g.nodes().iter().any(|n| n.op
        == Op::Attention(Attention {
            scale: 0.5,
            causal: true,
            dropout_p: 0.0,
            offset: 0,
            softcap: None
        })));
}

#[test]
fn inconsistent_shapes_are_errors_naming_op_and_shapes() {
    let mut g = Graph::new();
    let x = g.param("x", &[2, 3, 4]).unwrap();
    let w = g.param("w", &[5, 6]).unwrap();
    let (op, shapes) = shape_error(g.matmul(x, w, false, false));
    assert_eq!((op.as_str(), shapes.as_str()), ("matmul", "a=(2,3,4) b=(5,6)"));
    let err = g.matmul(x, w, false, false).unwrap_err().to_string();
    assert!(err.contains("matmul") && err.contains("K=4") && err.contains("(5,6)"), "{err}");

    let wb = g.param("wb", &[3, 4, 5]).unwrap(); // batched b whose batch dims differ from a's
    assert_eq!(shape_error(g.matmul(x, wb, false, false)).0, "matmul");
    let w35 = g.param("w35", &[3, 5]).unwrap();
    let err = g.matmul(x, w35, true, false).unwrap_err().to_string();
    assert!(err.contains("ta=true with a shared 2-D b"), "{err}");

    let bias = g.param("bias", &[3]).unwrap();
    assert_eq!(shape_error(g.bias_add(x, bias)), ("bias_add".into(), "x=(2,3,4) bias=(3)".into()));
    let y = g.param("y", &[3, 3]).unwrap();
    assert_eq!(shape_error(g.add(x, y)).0, "add");
    assert_eq!(shape_error(g.layer_norm(x, bias, bias, 1e-5)).0, "layernorm");
    assert_eq!(shape_error(g.reshape(x, &[5, 5])).0, "reshape");
    let split = g.split(x, &[2, 3]);
    assert!(matches!(split, Err(GraphError::Shape { op: "split", .. })));
    let x2 = g.param("x2", &[2, 3]).unwrap();
    assert_eq!(shape_error(g.concat(&[x, x2])).0, "concat");

    let mask = g.input_float("mask", &[2, 1, 3]).unwrap();
    assert_eq!(shape_error(g.softmax(x, 1.0, false, Some(mask))).0, "softmax");

    let q = g.param("q", &[1, 2, 3, 4]).unwrap();
    let k = g.param("k", &[1, 2, 3, 5]).unwrap();
    assert_eq!(shape_error(g.attention(q, k, k, AttentionOpts::default())).0, "attention");
    let bad_mask = g.input_float("bad_mask", &[1, 1, 3, 4]).unwrap();
    let opts = AttentionOpts { mask: Some(bad_mask), ..Default::default() };
    assert_eq!(shape_error(g.attention(q, q, q, opts)).0, "attention");

    let labels = g.input_ids("labels", &[2, 4]).unwrap();
    assert_eq!(
        shape_error(g.cross_entropy(x, labels)),
        ("cross_entropy".into(), "logits=(2,3,4) labels=(2,4)".into())
    );
    let table = g.param("table", &[2, 3, 4]).unwrap();
    assert_eq!(shape_error(g.embedding(table, labels)).0, "embedding");
}

#[test]
fn wrong_types_and_attributes_are_errors() {
    let mut g = Graph::new();
    let table = g.param("table", &[5, 3]).unwrap();
    let float_ids = g.input_float("ids", &[4]).unwrap();
    let err = g.embedding(table, float_ids).unwrap_err();
    assert!(matches!(err, GraphError::Type { op: "embedding", arg: "ids", .. }), "{err}");
    let ids = g.input_ids("ids2", &[4]).unwrap();
    assert!(matches!(g.gelu(ids, GeluApprox::Erf), Err(GraphError::Type { op: "gelu", .. })));
    assert!(matches!(g.dropout(table, 1.5), Err(GraphError::Attr { op: "dropout", .. })));
    assert!(matches!(g.permute(table, &[0, 0]), Err(GraphError::Attr { op: "permute", .. })));
    assert!(matches!(g.transpose(table, 0, 2), Err(GraphError::Attr { .. })));
    let w = g.param("w", &[3]).unwrap();
    assert!(matches!(
        g.layer_norm(table, w, w, f32::NAN),
        Err(GraphError::Attr { op: "layernorm", .. })
    ));
    assert!(matches!(g.set_loss(table), Err(GraphError::Shape { op: "loss", .. })));
    assert!(matches!(g.tanh(TensorId(999)), Err(GraphError::UnknownTensor(TensorId(999)))));
}

#[test]
fn dropout_sites_get_disjoint_counter_ranges() {
    let mut g = Graph::new();
    let x = g.param("x", &[4, 8]).unwrap();
    let a = g.dropout(x, 0.1).unwrap();
    let _ = g.dropout(a, 0.1).unwrap();
    let q = g.param("q", &[1, 2, 3, 4]).unwrap();
    let _ = g.attention(q, q, q, AttentionOpts { dropout_p: 0.1, ..Default::default() }).unwrap();
    let _ = g.dropout(x, 0.1).unwrap();
    let offsets: Vec<u64> = g
        .nodes()
        .iter()
        .filter_map(|n| match n.op {
            Op::Dropout(Dropout { offset, .. }) | Op::Attention(Attention { offset, .. }) => {
                Some(offset)
            }
            _ => None,
        })
        .collect();
    assert_eq!(offsets, [0, 32, 64, 64 + 18]);
}

#[test]
fn prints_one_line_per_node() {
    let mut g = Graph::new();
    let ids = g.input_ids("input_ids", &[8, 128]).unwrap();
    let wte = g.param("wte.weight", &[50, 768]).unwrap();
    let x = g.embedding(wte, ids).unwrap();
    let w = g.param("ln.weight", &[768]).unwrap();
    let b = g.param("ln.bias", &[768]).unwrap();
    let h = g.layer_norm(x, w, b, 1e-5).unwrap();
    let _ = g.matmul(h, wte, false, true).unwrap();
    let text = g.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "%0 = input \"input_ids\" (8,128) i64",
            "%1 = param \"wte.weight\" (50,768) f32 @0+38400",
            "%3 = param \"ln.weight\" (768) f32 @38400+768",
            "%4 = param \"ln.bias\" (768) f32 @39168+768",
            "%2 = embedding(%1, %0) (8,128,768) f32",
            "%5, %6, %7 = layernorm(%2, %3, %4) eps=1e-5 (8,128,768) f32, (8,128) f32, (8,128) f32",
            "%8 = matmul(%5, %1) ta=false tb=true (8,128,50) f32",
        ]
    );
}
