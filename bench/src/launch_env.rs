//! Who this worker is among the data-parallel ranks, read from the variables of the launcher
//! that started it — torchrun's, Slurm's `srun`'s or Open MPI's `mpirun`'s — into one
//! [`LaunchEnv`]. This is the one place that reads them: the worker joins the TCP group and
//! picks its GPU from it, and the harness (itself its workers' launcher) removes every variable
//! named in [`LAUNCH_VARS`] from their environment before setting torchrun's.
//!
//! Which variables count, when several launchers' are present (docs/usage.md, "Launchers"):
//! - **The innermost launcher's**: torchrun's (`RANK`, `WORLD_SIZE`) over mpirun's
//!   (`OMPI_COMM_WORLD_*`) over srun's (`SLURM_PROCID`, …). A launcher started by another
//!   inherits the outer one's variables — under `srun torchrun` every worker carries its node's
//!   `SLURM_PROCID`; under an sbatch script's `mpirun` or `torchrun` every rank carries the batch
//!   step's `SLURM_PROCID=0` — and none of the three sets the others'.
//! - **Compared only where they describe the same processes**: the variables of the launcher
//!   directly outside the chosen one (mpirun's, else srun's, outside RANK/WORLD_SIZE set by
//!   hand or by a wrapper script) when they claim the same world size. Then they must agree on
//!   the rank, the local rank and the local world size, else a one-line error names both sets.
//!   A different world size is another layer of launching (srun's tasks are torchrun's agents,
//!   the batch step is one task), not a disagreement. Never compared: the workers of torchrun's
//!   agent (`TORCHELASTIC_RUN_ID` set: the outer variables are the agents'), and mpirun's ranks
//!   with srun's variables (Open MPI under Slurm starts its ranks from the batch step or from
//!   daemons it starts with srun; neither's variables are the ranks').
//! - An outer set that cannot be read whole (an sbatch step without `SLURM_NTASKS`) is not
//!   compared; the chosen set must be complete, and a missing or malformed variable in it is an
//!   error naming the variable.

use anyhow::{anyhow, bail, Result};

/// The port rank 0 listens on when srun's variables leave it open: torchrun's default
/// (`--master-port 29500`), which torch's other launchers share.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Every variable this module reads to place a rank (not `CUDA_VISIBLE_DEVICES`, which is the
/// process's view of the machine rather than its rank). A launcher of workers removes them all
/// so that none of its own launcher's variables reach the workers.
pub const LAUNCH_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
];

/// The launcher whose variables placed this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun, or anything that sets its variables (ortbench's harness, a wrapper script).
    Torchrun,
    Mpirun,
    Srun,
}

impl Launcher {
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::Mpirun => "mpirun",
            Launcher::Srun => "srun",
        }
    }

    /// The variable that holds the world size (for errors that name it).
    pub fn world_var(self) -> &'static str {
        self.vars()[1]
    }

    /// Rank, world size, local rank and local world size, by name.
    fn vars(self) -> [&'static str; 4] {
        match self {
            Launcher::Torchrun => ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
            Launcher::Mpirun => [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ],
            // srun's local world size comes from its tasks-per-node list (`local_world_srun`).
            Launcher::Srun => {
                ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE"]
            }
        }
    }
}

/// This rank's place among the ranks and where rank 0 listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub launcher: Launcher,
    pub rank: usize,
    pub world: usize,
    /// Among the ranks of this machine; None only where torchrun-style variables set by hand
    /// leave `LOCAL_RANK` / `LOCAL_WORLD_SIZE` out (mpirun and srun always set theirs).
    pub local_rank: Option<usize>,
    pub local_world: Option<usize>,
    pub master_addr: String,
    pub master_port: u16,
    /// How many GPUs `CUDA_VISIBLE_DEVICES` leaves this process; None when it is unset.
    pub visible_gpus: Option<usize>,
}

/// What one launcher's variables say about this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    launcher: Launcher,
    rank: usize,
    world: usize,
    local_rank: Option<usize>,
    local_world: Option<usize>,
}

impl Claim {
    /// `RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 (torchrun)`: the values as the launcher named them.
    fn describe(&self) -> String {
        let [r, w, lr, lw] = self.launcher.vars();
        let mut s = format!("{r}={} {w}={}", self.rank, self.world);
        if let Some(v) = self.local_rank {
            s += &format!(" {lr}={v}");
        }
        match (self.local_world, self.launcher) {
            // srun's is this node's entry of a list, not a variable's value.
            (Some(v), Launcher::Srun) => s += &format!(" of {v} on this node"),
            (Some(v), _) => s += &format!(" {lw}={v}"),
            (None, _) => {}
        }
        format!("{s} ({})", self.launcher.name())
    }
}

impl LaunchEnv {
    /// The launch described by this process's environment; None when no launcher's variables
    /// are set (the run's ranks are then threads of this worker).
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// As [`LaunchEnv::from_env`], with `get` as the environment.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let get = &get;
        let has = |k: &str| get(k).is_some();
        let torchrun = has("RANK") || has("WORLD_SIZE");
        let mpirun = has("OMPI_COMM_WORLD_RANK") || has("OMPI_COMM_WORLD_SIZE");
        let srun = has("SLURM_PROCID");
        let chosen = if torchrun {
            torchrun_claim(get)?
        } else if mpirun {
            mpirun_claim(get)?
        } else if srun {
            srun_claim(get)?
        } else {
            return Ok(None);
        };
        // The launcher directly outside the chosen one, where the rule compares them (module
        // doc); read leniently: an outer set that is not whole is not this process's.
        let outer = match chosen.launcher {
            Launcher::Torchrun if has("TORCHELASTIC_RUN_ID") => None,
            Launcher::Torchrun if mpirun => mpirun_claim(get).ok(),
            Launcher::Torchrun if srun => srun_claim(get).ok(),
            _ => None,
        };
        if let Some(o) = outer.filter(|o| o.world == chosen.world) {
            let differ = |a: Option<usize>, b: Option<usize>| a.zip(b).is_some_and(|(a, b)| a != b);
            if o.rank != chosen.rank
                || differ(o.local_rank, chosen.local_rank)
                || differ(o.local_world, chosen.local_world)
            {
                bail!(
                    "launch variables disagree: {} but {}, both for a world of {}; unset the variables of the launcher that did not start this process",
                    chosen.describe(),
                    o.describe(),
                    chosen.world
                );
            }
        }
        let (master_addr, master_port) = match chosen.launcher {
            Launcher::Torchrun => (
                required(get, "MASTER_ADDR", "torchrun sets it; by hand set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT")?,
                port(get, "MASTER_PORT")?.ok_or_else(|| {
                    anyhow!("MASTER_PORT is not set (torchrun sets it; by hand set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
                })?,
            ),
            Launcher::Mpirun => (
                required(get, "MASTER_ADDR", "under mpirun every rank needs rank 0's host, as torch requires: mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<port>")?,
                port(get, "MASTER_PORT")?.ok_or_else(|| {
                    anyhow!("MASTER_PORT is not set (under mpirun every rank needs the port rank 0 listens on, as torch requires: mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<port>)")
                })?,
            ),
            // srun starts task 0 on the first node of the step (block distribution, srun's
            // default): the step's node list when srun gives it, else the job's.
            Launcher::Srun => {
                let addr = match get("MASTER_ADDR") {
                    Some(a) => a,
                    None => {
                        let (var, list) = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"]
                            .into_iter()
                            .find_map(|k| get(k).map(|v| (k, v)))
                            .ok_or_else(|| anyhow!("under srun neither MASTER_ADDR nor SLURM_JOB_NODELIST is set: which host is rank 0's?"))?;
                        first_host(&list).map_err(|e| anyhow!("{var} '{list}': {e}"))?
                    }
                };
                (addr, port(get, "MASTER_PORT")?.unwrap_or(DEFAULT_MASTER_PORT))
            }
        };
        if master_addr.trim().is_empty() {
            bail!("MASTER_ADDR is empty");
        }
        Ok(Some(LaunchEnv {
            launcher: chosen.launcher,
            rank: chosen.rank,
            world: chosen.world,
            local_rank: chosen.local_rank,
            local_world: chosen.local_world,
            master_addr,
            master_port,
            visible_gpus: get("CUDA_VISIBLE_DEVICES")
                .map(|v| v.split(',').filter(|d| !d.trim().is_empty()).count()),
        }))
    }

    /// Rank 0's address as `host:port` (an IPv6 address in brackets).
    pub fn master(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }

    /// The GPU this rank trains on: the only one `CUDA_VISIBLE_DEVICES` leaves it (srun's
    /// `--gpus-per-task`, a cluster's per-task binding), else `cuda:LOCAL_RANK` among the
    /// machine's, torchrun's convention.
    pub fn gpu(&self) -> Result<usize> {
        if self.visible_gpus == Some(1) {
            return Ok(0);
        }
        self.local_rank.ok_or_else(|| {
            anyhow!("LOCAL_RANK is not set: which of this machine's GPUs is this rank's? (torchrun sets it; or leave the rank one GPU in CUDA_VISIBLE_DEVICES)")
        })
    }
}

/// `k` as a non-negative integer; None when unset.
fn num(get: &dyn Fn(&str) -> Option<String>, k: &str) -> Result<Option<usize>> {
    get(k)
        .map(|v| v.trim().parse().map_err(|_| anyhow!("{k} is '{v}', not a non-negative integer")))
        .transpose()
}

fn need(get: &dyn Fn(&str) -> Option<String>, k: &str, launcher: Launcher) -> Result<usize> {
    num(get, k)?.ok_or_else(|| anyhow!("{k} is not set ({} sets it)", launcher.name()))
}

fn required(get: &dyn Fn(&str) -> Option<String>, k: &str, why: &str) -> Result<String> {
    get(k).ok_or_else(|| anyhow!("{k} is not set ({why})"))
}

fn port(get: &dyn Fn(&str) -> Option<String>, k: &str) -> Result<Option<u16>> {
    get(k)
        .map(|v| match v.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(anyhow!("{k} is '{v}', not a TCP port")),
        })
        .transpose()
}

/// A claim's values are a place among the ranks (rank below the world, and so on).
fn checked(c: Claim) -> Result<Claim> {
    let [r, w, lr, lw] = c.launcher.vars();
    if c.world == 0 || c.rank >= c.world {
        bail!("{r} {} is not below {w} {}", c.rank, c.world);
    }
    if let Some(l) = c.local_world {
        if l == 0 || l > c.world {
            bail!("{lw} {l} is not between 1 and {w} {}", c.world);
        }
        if let Some(x) = c.local_rank.filter(|&x| x >= l) {
            bail!("{lr} {x} is not below {lw} {l}");
        }
    }
    Ok(c)
}

fn torchrun_claim(get: &dyn Fn(&str) -> Option<String>) -> Result<Claim> {
    let l = Launcher::Torchrun;
    // RANK and WORLD_SIZE come together: one without the other is a half-set launch.
    let why = "set RANK and WORLD_SIZE together";
    checked(Claim {
        launcher: l,
        rank: num(get, "RANK")?
            .ok_or_else(|| anyhow!("RANK is not set but WORLD_SIZE is ({why})"))?,
        world: num(get, "WORLD_SIZE")?
            .ok_or_else(|| anyhow!("WORLD_SIZE is not set but RANK is ({why})"))?,
        local_rank: num(get, "LOCAL_RANK")?,
        local_world: num(get, "LOCAL_WORLD_SIZE")?,
    })
}

fn mpirun_claim(get: &dyn Fn(&str) -> Option<String>) -> Result<Claim> {
    let l = Launcher::Mpirun;
    let [r, w, lr, lw] = l.vars();
    checked(Claim {
        launcher: l,
        rank: need(get, r, l)?,
        world: need(get, w, l)?,
        local_rank: Some(need(get, lr, l)?),
        local_world: Some(need(get, lw, l)?),
    })
}

fn srun_claim(get: &dyn Fn(&str) -> Option<String>) -> Result<Claim> {
    let l = Launcher::Srun;
    checked(Claim {
        launcher: l,
        rank: need(get, "SLURM_PROCID", l)?,
        world: need(get, "SLURM_NTASKS", l)?,
        local_rank: Some(need(get, "SLURM_LOCALID", l)?),
        local_world: Some(local_world_srun(get)?),
    })
}

/// The number of srun's tasks on this node: this node's entry (`SLURM_NODEID`) of the step's
/// tasks-per-node list (`2(x3),1`), else of the job's, else `SLURM_NTASKS_PER_NODE` (set only
/// when the job asked for it).
fn local_world_srun(get: &dyn Fn(&str) -> Option<String>) -> Result<usize> {
    let list = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
        .into_iter()
        .find_map(|k| get(k).map(|v| (k, v)));
    if let Some((k, v)) = list {
        let per_node = tasks_per_node(&v).map_err(|e| anyhow!("{k} '{v}': {e}"))?;
        return match num(get, "SLURM_NODEID")? {
            Some(node) => per_node.get(node).copied().ok_or_else(|| {
                anyhow!("SLURM_NODEID {node} but {k} '{v}' lists {} node(s)", per_node.len())
            }),
            None if per_node.iter().all(|&n| n == per_node[0]) => Ok(per_node[0]),
            None => bail!("{k} '{v}' differs between nodes and SLURM_NODEID is not set: how many tasks are on this node?"),
        };
    }
    num(get, "SLURM_NTASKS_PER_NODE")?.ok_or_else(|| {
        anyhow!("neither SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE is set (srun sets them): how many tasks are on this node?")
    })
}

/// Slurm's tasks-per-node list, one entry per node: `2(x3),1` is [2, 2, 2, 1].
pub fn tasks_per_node(s: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (n, times) = match part.split_once("(x") {
            Some((n, rest)) => {
                let t = rest.strip_suffix(')').ok_or_else(|| anyhow!("'{part}' lacks its ')'"))?;
                (n, t.parse::<usize>().map_err(|_| anyhow!("'{part}': bad repeat count"))?)
            }
            None => (part, 1),
        };
        let n: usize = n.parse().map_err(|_| anyhow!("'{part}' is not a task count"))?;
        if times == 0 || out.len() + times > MAX_HOSTS {
            bail!("'{part}': bad repeat count");
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

/// More hosts than any job has: a list that expands past it is a malformed one.
const MAX_HOSTS: usize = 1 << 20;

/// The first host of a Slurm host list (rank 0's under srun's block distribution).
pub fn first_host(list: &str) -> Result<String> {
    // The first item alone: the rest may be long, and only its syntax would be checked.
    let first = split_items(list)?.into_iter().next().ok_or_else(|| anyhow!("no host"))?;
    Ok(expand_item(first)?.swap_remove(0))
}

/// Slurm's compact host list expanded, in Slurm's order: comma-separated items, each a name
/// with bracketed ranges (`node[01-02,07]`: zero-padded to the width of a range's low bound),
/// several groups in one name expanding left to right (`r[1-2]n[1-2]`: r1n1, r1n2, r2n1, r2n2).
pub fn expand_hostlist(list: &str) -> Result<Vec<String>> {
    let mut hosts = Vec::new();
    for item in split_items(list)? {
        hosts.extend(expand_item(item)?);
        if hosts.len() > MAX_HOSTS {
            bail!("more than {MAX_HOSTS} hosts");
        }
    }
    Ok(hosts)
}

/// The list's items: split at the commas outside brackets.
fn split_items(list: &str) -> Result<Vec<&str>> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => bail!("nested '[' at {i}"),
            ']' if depth == 1 => depth = 0,
            ']' => bail!("']' without '[' at {i}"),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        bail!("'[' without ']'");
    }
    items.push(&list[start..]);
    if let Some(i) = items.iter().position(|h| h.trim().is_empty()) {
        bail!("empty host name (item {})", i + 1);
    }
    Ok(items.into_iter().map(str::trim).collect())
}

/// One item (brackets balanced, unnested: `split_items` checked) expanded.
fn expand_item(item: &str) -> Result<Vec<String>> {
    let mut out = vec![String::new()];
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']').expect("balanced");
        let values = expand_ranges(&rest[open + 1..close])?;
        if out.len() * values.len() > MAX_HOSTS {
            bail!("'{item}' expands to more than {MAX_HOSTS} hosts");
        }
        let prefix = &rest[..open];
        out = out
            .iter()
            .flat_map(|h| values.iter().map(move |v| format!("{h}{prefix}{v}")))
            .collect();
        rest = &rest[close + 1..];
    }
    for h in &mut out {
        h.push_str(rest);
    }
    Ok(out)
}

/// The inside of one bracket: `01-02,07` is ["01", "02", "07"].
fn expand_ranges(inner: &str) -> Result<Vec<String>> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut out = Vec::new();
    for part in inner.split(',') {
        match part.split_once('-') {
            Some((lo, hi)) if digits(lo) && digits(hi) => {
                let (a, b): (u64, u64) = (lo.parse()?, hi.parse()?);
                if a > b {
                    bail!("range '{part}' runs backwards");
                }
                if (b - a) as usize >= MAX_HOSTS {
                    bail!("range '{part}' has more than {MAX_HOSTS} hosts");
                }
                let width = lo.len();
                out.extend((a..=b).map(|n| format!("{n:0width$}")));
            }
            None if digits(part) => out.push(part.to_string()),
            _ => bail!("'[{inner}]': '{part}' is not a number or a range of numbers"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<Option<LaunchEnv>> {
        let m: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_vars(|k| m.get(k).cloned())
    }

    fn err(vars: &[(&str, &str)]) -> String {
        format!("{:#}", env(vars).expect_err("an error"))
    }

    const TORCHRUN: &[(&str, &str)] = &[
        ("RANK", "5"),
        ("WORLD_SIZE", "16"),
        ("LOCAL_RANK", "5"),
        ("LOCAL_WORLD_SIZE", "8"),
        ("MASTER_ADDR", "node01"),
        ("MASTER_PORT", "29400"),
    ];

    /// Task 9 of `srun -N2 --ntasks-per-node=8` on the job's nodes gpu-a[1-2].
    const SRUN: &[(&str, &str)] = &[
        ("SLURM_PROCID", "9"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_TASKS_PER_NODE", "8(x2)"),
        ("SLURM_JOB_NODELIST", "gpu-a[1-2]"),
    ];

    const MPIRUN: &[(&str, &str)] = &[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "6000"),
    ];

    fn with(
        base: &[(&'static str, &'static str)],
        more: &[(&'static str, &'static str)],
    ) -> Vec<(&'static str, &'static str)> {
        // Later entries win, as a later `export` does.
        let mut v: Vec<_> =
            base.iter().filter(|(k, _)| !more.iter().any(|(m, _)| m == k)).copied().collect();
        v.extend_from_slice(more);
        v
    }

    #[test]
    fn hostlist_expands_ranges_padding_and_several_groups() {
        assert_eq!(
            expand_hostlist("node[01-02,07],gpu-a[1-3]").unwrap(),
            ["node01", "node02", "node07", "gpu-a1", "gpu-a2", "gpu-a3"]
        );
        assert_eq!(expand_hostlist("localhost").unwrap(), ["localhost"]);
        assert_eq!(expand_hostlist("a,b.example.org").unwrap(), ["a", "b.example.org"]);
        // The width is the low bound's: 9-10 unpadded, 098-100 padded to 3.
        assert_eq!(expand_hostlist("n[9-10]").unwrap(), ["n9", "n10"]);
        assert_eq!(expand_hostlist("n[098-100]").unwrap(), ["n098", "n099", "n100"]);
        // Several groups in one name, a suffix after the bracket.
        assert_eq!(
            expand_hostlist("rack[1-2]-n[01-02]-ib").unwrap(),
            ["rack1-n01-ib", "rack1-n02-ib", "rack2-n01-ib", "rack2-n02-ib"]
        );
        assert_eq!(expand_hostlist("x[3],y").unwrap(), ["x3", "y"]);
        assert_eq!(first_host("node[01-02,07],gpu-a[1-3]").unwrap(), "node01");
        assert_eq!(first_host("gpu-a[1-3],node[01-02]").unwrap(), "gpu-a1");
        assert_eq!(first_host("localhost").unwrap(), "localhost");
    }

    #[test]
    fn hostlist_refuses_malformed_lists() {
        for (list, why) in [
            ("node[01-02", "'[' without ']'"),
            ("node01]", "']' without '['"),
            ("node[0[1]]", "nested"),
            ("node[a-b]", "not a number"),
            ("node[02-01]", "backwards"),
            ("node[]", "not a number"),
            ("node[1-]", "not a number"),
            ("a,,b", "empty host name"),
            ("", "empty host name"),
            ("n[0-99999999]", "more than"),
        ] {
            let e = format!("{:#}", expand_hostlist(list).expect_err(list));
            assert!(e.contains(why), "{list}: {e}");
        }
    }

    #[test]
    fn tasks_per_node_expands_repeats() {
        assert_eq!(tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(tasks_per_node("8").unwrap(), [8]);
        for bad in ["2(x3", "x", "2(x0)", ""] {
            assert!(tasks_per_node(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_launcher_variables_mean_thread_ranks() {
        assert_eq!(env(&[("CUDA_VISIBLE_DEVICES", "0"), ("MASTER_PORT", "1")]).unwrap(), None);
    }

    #[test]
    fn torchrun_variables_place_the_rank() {
        let l = env(TORCHRUN).unwrap().unwrap();
        assert_eq!(
            l,
            LaunchEnv {
                launcher: Launcher::Torchrun,
                rank: 5,
                world: 16,
                local_rank: Some(5),
                local_world: Some(8),
                master_addr: "node01".into(),
                master_port: 29400,
                visible_gpus: None,
            }
        );
        assert_eq!(l.master(), "node01:29400");
        assert_eq!(l.gpu().unwrap(), 5);
        // By hand, without the local variables: fine on the CPU, but no GPU can be chosen.
        let l = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "7"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((l.local_rank, l.local_world, l.master().as_str()), (None, None, "[::1]:7"));
        assert!(format!("{:#}", l.gpu().unwrap_err()).contains("LOCAL_RANK is not set"));
    }

    #[test]
    fn srun_variables_place_the_rank_with_the_first_host_as_master() {
        let l = env(SRUN).unwrap().unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank, l.local_world),
            (Launcher::Srun, 9, 16, Some(1), Some(8))
        );
        assert_eq!(l.master(), format!("gpu-a1:{DEFAULT_MASTER_PORT}"));
        // The step's node list over the job's; MASTER_ADDR/MASTER_PORT over both.
        let l = env(&with(SRUN, &[("SLURM_STEP_NODELIST", "gpu-a[2-3]")])).unwrap().unwrap();
        assert_eq!(l.master_addr, "gpu-a2");
        let l =
            env(&with(SRUN, &[("MASTER_ADDR", "head"), ("MASTER_PORT", "4000")])).unwrap().unwrap();
        assert_eq!(l.master(), "head:4000");
        // Uneven tasks per node: this node's entry.
        let l = env(&with(SRUN, &[("SLURM_TASKS_PER_NODE", "9,7"), ("SLURM_LOCALID", "0")]))
            .unwrap()
            .unwrap();
        assert_eq!(l.local_world, Some(7));
        // Only the requested count.
        let no_list: Vec<_> = with(SRUN, &[("SLURM_NTASKS_PER_NODE", "8")])
            .into_iter()
            .filter(|(k, _)| *k != "SLURM_TASKS_PER_NODE")
            .collect();
        assert_eq!(env(&no_list).unwrap().unwrap().local_world, Some(8));
    }

    #[test]
    fn mpirun_variables_need_master_addr_and_port() {
        let l = env(MPIRUN).unwrap().unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank, l.local_world, l.master()),
            (Launcher::Mpirun, 3, 4, Some(1), Some(2), "10.0.0.1:6000".to_string())
        );
        let no_addr: Vec<_> = MPIRUN.iter().filter(|(k, _)| *k != "MASTER_ADDR").copied().collect();
        let e = err(&no_addr);
        assert!(
            e.starts_with("MASTER_ADDR is not set") && e.contains("mpirun -x MASTER_ADDR"),
            "{e}"
        );
        let no_port: Vec<_> = MPIRUN.iter().filter(|(k, _)| *k != "MASTER_PORT").copied().collect();
        assert!(err(&no_port).starts_with("MASTER_PORT is not set"), "{}", err(&no_port));
    }

    #[test]
    fn the_gpu_is_the_only_visible_one_else_the_local_rank() {
        let l = env(&with(SRUN, &[("CUDA_VISIBLE_DEVICES", "3")])).unwrap().unwrap();
        assert_eq!(l.gpu().unwrap(), 0);
        let l = env(&with(SRUN, &[("CUDA_VISIBLE_DEVICES", "0,1,2,3")])).unwrap().unwrap();
        assert_eq!(l.gpu().unwrap(), 1);
        assert_eq!(env(SRUN).unwrap().unwrap().gpu().unwrap(), 1);
    }

    #[test]
    fn bad_or_missing_variables_are_named() {
        for (vars, want) in [
            (with(TORCHRUN, &[("RANK", "x")]), "RANK is 'x', not a non-negative integer"),
            (with(TORCHRUN, &[("RANK", "16")]), "RANK 16 is not below WORLD_SIZE 16"),
            (
                with(TORCHRUN, &[("LOCAL_RANK", "8")]),
                "LOCAL_RANK 8 is not below LOCAL_WORLD_SIZE 8",
            ),
            (with(TORCHRUN, &[("MASTER_PORT", "70000")]), "MASTER_PORT is '70000', not a TCP port"),
            (vec![("WORLD_SIZE", "2")], "RANK is not set but WORLD_SIZE is"),
            (with(SRUN, &[("SLURM_NTASKS", "8")]), "SLURM_PROCID 9 is not below SLURM_NTASKS 8"),
            (
                with(SRUN, &[("SLURM_NODEID", "2")]),
                "SLURM_NODEID 2 but SLURM_TASKS_PER_NODE '8(x2)' lists 2 node(s)",
            ),
            (
                with(SRUN, &[("SLURM_JOB_NODELIST", "gpu-a[1-2")]),
                "SLURM_JOB_NODELIST 'gpu-a[1-2': '[' without ']'",
            ),
            (
                SRUN.iter().filter(|(k, _)| *k != "SLURM_NTASKS").copied().collect(),
                "SLURM_NTASKS is not set (srun sets it)",
            ),
            (
                SRUN.iter().filter(|(k, _)| *k != "SLURM_JOB_NODELIST").copied().collect(),
                "neither MASTER_ADDR nor SLURM_JOB_NODELIST is set",
            ),
            (
                MPIRUN
                    .iter()
                    .filter(|(k, _)| *k != "OMPI_COMM_WORLD_LOCAL_RANK")
                    .copied()
                    .collect(),
                "OMPI_COMM_WORLD_LOCAL_RANK is not set (mpirun sets it)",
            ),
        ] {
            let e = err(&vars);
            assert!(e.contains(want), "want '{want}', got '{e}'");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    /// torchrun's variables and srun's for the same world of 16, set by a wrapper under srun.
    fn wrapper_under_srun(
        rank: &'static str,
        local: &'static str,
    ) -> Vec<(&'static str, &'static str)> {
        with(
            SRUN,
            &[
                ("RANK", rank),
                ("WORLD_SIZE", "16"),
                ("LOCAL_RANK", local),
                ("MASTER_ADDR", "gpu-a1"),
                ("MASTER_PORT", "29500"),
            ],
        )
    }

    #[test]
    fn launchers_that_describe_the_same_world_must_agree() {
        // A wrapper that translated srun's variables faithfully.
        let l = env(&wrapper_under_srun("9", "1")).unwrap().unwrap();
        assert_eq!((l.launcher, l.rank), (Launcher::Torchrun, 9));
        // One that did not: the rank, or the local rank, differs.
        let e = err(&wrapper_under_srun("1", "1"));
        assert_eq!(
            e,
            "launch variables disagree: RANK=1 WORLD_SIZE=16 LOCAL_RANK=1 (torchrun) but SLURM_PROCID=9 SLURM_NTASKS=16 SLURM_LOCALID=1 of 8 on this node (srun), both for a world of 16; unset the variables of the launcher that did not start this process"
        );
        assert!(err(&wrapper_under_srun("9", "0")).contains("LOCAL_RANK=0 (torchrun) but"));
        // The same under mpirun.
        let under_mpirun = with(MPIRUN, &[("RANK", "2"), ("WORLD_SIZE", "4")]);
        let e = err(&under_mpirun);
        assert!(e.contains("RANK=2 WORLD_SIZE=4 (torchrun) but OMPI_COMM_WORLD_RANK=3"), "{e}");
    }

    #[test]
    fn an_outer_launcher_of_another_world_or_of_torchruns_agents_is_not_compared() {
        // An sbatch script running torchrun (or RANK… by hand): the batch step is task 0 of 1.
        let batch_step = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "0"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("SLURM_JOB_NODELIST", "node01"),
        ];
        let l = env(&with(
            &batch_step,
            &[
                ("RANK", "3"),
                ("WORLD_SIZE", "8"),
                ("MASTER_ADDR", "node01"),
                ("MASTER_PORT", "29500"),
            ],
        ))
        .unwrap()
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.world), (Launcher::Torchrun, 3, 8));
        // `srun -N2 --ntasks-per-node=1 torchrun --nproc-per-node 8`: srun's tasks are the
        // agents, a world of 2 against torchrun's 16.
        let agents = with(
            SRUN,
            &[
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "0"),
                ("SLURM_TASKS_PER_NODE", "1(x2)"),
            ],
        );
        assert_eq!(env(&with(&agents, TORCHRUN)).unwrap().unwrap().rank, 5);
        // torchrun's workers, even where the worlds match (one process per node): the agent's
        // node rank comes from its rendezvous, not from srun.
        let one_per_node = with(
            TORCHRUN,
            &[
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "1"),
                ("TORCHELASTIC_RUN_ID", "job"),
            ],
        );
        let agents = with(&agents, &[("SLURM_PROCID", "0")]);
        assert_eq!(env(&with(&agents, &one_per_node)).unwrap().unwrap().rank, 1);
        // mpirun's ranks under an sbatch step of the same task count: mpirun's, uncompared.
        let step = with(
            SRUN,
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", "0"),
                ("SLURM_NODEID", "0"),
                ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ],
        );
        let l = env(&with(&step, MPIRUN)).unwrap().unwrap();
        assert_eq!((l.launcher, l.rank), (Launcher::Mpirun, 3));
        // An outer set that is not whole (a batch step without SLURM_NTASKS) is not compared.
        let partial: Vec<_> =
            with(&batch_step, TORCHRUN).into_iter().filter(|(k, _)| *k != "SLURM_NTASKS").collect();
        assert_eq!(env(&partial).unwrap().unwrap().rank, 5);
    }
}
