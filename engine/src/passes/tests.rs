//! The pass pipeline as a whole, and the pass configuration.

use super::testutil::*;
use super::*;

#[test]
fn config_parses_names_signs_all_and_none() {
    let all = PassConfig::all();
    assert!(all.enabled("fuse_attention") && !all.enabled("recompute_gelu"));
    assert_eq!(PassConfig::parse("").unwrap(), all);
    assert_eq!(PassConfig::parse("all").unwrap(), all);
    assert_eq!(PassConfig::parse("none").unwrap(), PassConfig::none());
    let c = PassConfig::parse("-fuse_add_layernorm, +recompute_gelu").unwrap();
    assert!(
        !c.enabled("fuse_add_layernorm")
            && c.enabled("recompute_gelu")
            && c.enabled("fuse_attention")
    );
    let c = PassConfig::parse("none,fuse_attention").unwrap();
    assert_eq!(c.to_string(), "fuse_attention");
    assert_eq!(c, PassConfig::none().with("fuse_attention", true));
    let e = PassConfig::parse("-fuse_everything").unwrap_err().to_string();
    assert!(
        e.contains("ORTBENCH_PASSES")
            && e.contains("unknown pass 'fuse_everything'")
            && e.contains("fuse_matmul_bias"),
        "{e}"
    );
    assert_eq!(PassConfig::names().len(), 12);
    assert_eq!(PassConfig::none().to_string(), "none");
}

/// Every default pass on the eager GPT-2-like graph: the fused graph computes the same loss and
/// gradients (reference f64, and the planned executor in f32), keeps the parameter layout and
/// the dropout counters, and has the expected ops.
#[test]
fn all_passes_on_an_eager_gpt_keep_the_numbers() {
    for dropout in [0.0, 0.1] {
        let g = eager_gpt(2, 7, 16, 2, 23, 2, dropout);
        let (opt, report) = run_forward(&g, &PassConfig::all()).unwrap();
        println!("dropout {dropout}: {report}\n{}\n{opt}", op_count_diff(&g, &opt));
        let c = op_counts(&opt);
        assert_eq!((c["attention"], c["linear"], c["add_layernorm"]), (2, 8, 4));
        assert_eq!(c["permute"], 8); // head splits and merges: views the planner folds
        for gone in ["softmax", "scale", "bias_add", "gelu"] {
            assert!(!c.contains_key(gone), "{gone} left:\n{opt}");
        }
        assert_eq!(c.get("dropout").copied().unwrap_or(0), if dropout > 0.0 { 5 } else { 0 });
        assert_eq!(opt.rng_offset, g.rng_offset);
        assert_same_numbers(&g, &opt, 1e-10, true);
        // And the training pass on top.
        let t = train(&opt);
        let (t2, r2) = run_training(&t, &PassConfig::all().with("recompute_gelu", true)).unwrap();
        assert_eq!(r2.rewrites("recompute_gelu"), 2);
        assert_same_numbers(&t, &t2, 0.0, true);
    }
}

#[test]
fn none_changes_nothing_and_stages_are_checked() {
    let g = eager_gpt(1, 4, 8, 2, 9, 1, 0.0);
    let (same, report) = run_forward(&g, &PassConfig::none()).unwrap();
    assert_eq!((same.nodes(), report.to_string().as_str()), (g.nodes(), "no passes"));
    let t = train(&g);
    assert!(run_forward(&t, &PassConfig::all()).is_err());
    assert!(run_training(&g, &PassConfig::all()).is_err());
}
