//! Who launched this process, and as which rank: read from the environment that Slurm
//! (`srun`), Open MPI (`mpirun`) or a PMI launcher (MPICH's Hydra) gives each process, with
//! no MPI library linked. Also Slurm's compressed host lists (`node[01-03,07]`), whose first
//! host is where rank 0 runs under the usual task distributions.

use std::fmt;

/// The launcher a rank's numbers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LauncherKind {
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// A PMI launcher such as MPICH's Hydra (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`).
    Slurm,
}

impl fmt::Display for LauncherKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LauncherKind::OpenMpi => "Open MPI",
            LauncherKind::Pmi => "PMI",
            LauncherKind::Slurm => "Slurm",
        })
    }
}

/// Where rank 0 runs, as far as the launcher says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankZeroHost {
    /// Every rank runs on this host: rank 0 is on loopback.
    ThisHost,
    /// The first node of the launcher's node list.
    Node(String),
    /// The launcher does not say; `--rendezvous` must.
    Unknown(String),
}

/// This process's place in the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The launcher.
    pub kind: LauncherKind,
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// How many ranks the run has.
    pub size: usize,
    /// Where rank 0 is.
    pub rank_zero: RankZeroHost,
}

/// Every variable [`Launch::from_env`] looks at, in the order it looks, for error messages.
pub const LOOKED_FOR: &str = "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), \
     PMI_RANK/PMI_SIZE (MPICH's Hydra and other PMI launchers), SLURM_PROCID/SLURM_NTASKS \
     (Slurm's srun)";

/// Why the environment does not describe a rank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// No launcher's variables are set.
    #[error(
        "--cluster needs a launcher: none of {LOOKED_FOR} is set; start every rank with \
         srun or mpirun (e.g. `mpirun -np 4 stride-perf write bw --cluster`), or set the \
         variables by hand"
    )]
    NoLauncher,
    /// A variable is set but is not what the launcher would set.
    #[error("{launcher}: {message}")]
    Inconsistent {
        /// Which launcher's variables.
        launcher: LauncherKind,
        /// What is wrong, naming the variables and their values.
        message: String,
    },
}

/// What a host list such as `node[01-03,07]` could not be read as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host list \"{list}\": {message}")]
pub struct HostListError {
    /// The list, made printable and cut.
    pub list: String,
    /// What is wrong.
    pub message: String,
}

/// The most hosts a host list may expand to: far more than any cluster, few enough that a
/// typo like `n[0-999999999]` is refused instead of filling memory.
pub const HOST_LIST_MAX: usize = 1 << 16;

impl Launch {
    /// Reads the launcher's variables from the process environment.
    pub fn from_env() -> Result<Self, LaunchError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the launcher's variables through `var` (the environment, or a test's table).
    ///
    /// Open MPI first, then PMI, then Slurm: `mpirun` inside a Slurm allocation starts its
    /// daemons with srun, so its ranks inherit `SLURM_PROCID` of a daemon, not their own.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, LaunchError> {
        let present = |name: &str| var(name).is_some();
        if present("OMPI_COMM_WORLD_RANK") || present("OMPI_COMM_WORLD_SIZE") {
            let kind = LauncherKind::OpenMpi;
            let (rank, size) =
                rank_and_size(kind, &var, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")?;
            let local = number(kind, &var, "OMPI_COMM_WORLD_LOCAL_SIZE")?;
            let rank_zero = match local {
                Some(l) if l == size => RankZeroHost::ThisHost,
                Some(l) if l > size => {
                    return Err(inconsistent(
                        kind,
                        format!(
                            "OMPI_COMM_WORLD_LOCAL_SIZE={l} is larger than \
                             OMPI_COMM_WORLD_SIZE={size}"
                        ),
                    ))
                }
                _ => RankZeroHost::Unknown(
                    "Open MPI does not tell a rank on which host rank 0 runs".into(),
                ),
            };
            return Ok(Launch {
                kind,
                rank,
                size,
                rank_zero,
            });
        }
        if present("PMI_RANK") || present("PMI_SIZE") {
            let kind = LauncherKind::Pmi;
            let (rank, size) = rank_and_size(kind, &var, "PMI_RANK", "PMI_SIZE")?;
            let rank_zero = match number(kind, &var, "MPI_LOCALNRANKS")? {
                Some(l) if l == size => RankZeroHost::ThisHost,
                _ => RankZeroHost::Unknown(
                    "a PMI launcher does not tell a rank on which host rank 0 runs".into(),
                ),
            };
            return Ok(Launch {
                kind,
                rank,
                size,
                rank_zero,
            });
        }
        if present("SLURM_PROCID") {
            let kind = LauncherKind::Slurm;
            let (rank, size) = rank_and_size(kind, &var, "SLURM_PROCID", "SLURM_NTASKS")?;
            // The step's nodes when srun runs inside a bigger allocation, else the job's.
            let list = [
                "SLURM_STEP_NODELIST",
                "SLURM_JOB_NODELIST",
                "SLURM_NODELIST",
            ]
            .into_iter()
            .find_map(|name| var(name).map(|v| (name, v)));
            let rank_zero = match list {
                None => RankZeroHost::Unknown(
                    "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set".into(),
                ),
                Some((name, list)) => {
                    let hosts = parse_host_list(&list)
                        .map_err(|e| inconsistent(kind, format!("{name}: {e}")))?;
                    let nodes = if name == "SLURM_STEP_NODELIST" {
                        "SLURM_STEP_NUM_NODES"
                    } else {
                        "SLURM_JOB_NUM_NODES"
                    };
                    if let Some(n) = number(kind, &var, nodes)? {
                        if n != hosts.len() {
                            return Err(inconsistent(
                                kind,
                                format!("{name} names {} hosts but {nodes}={n}", hosts.len()),
                            ));
                        }
                    }
                    if hosts.len() > size {
                        return Err(inconsistent(
                            kind,
                            format!(
                                "{name} names {} hosts but SLURM_NTASKS={size}: a node \
                                 without a task",
                                hosts.len()
                            ),
                        ));
                    }
                    match hosts.into_iter().next() {
                        Some(first) => RankZeroHost::Node(first),
                        None => {
                            return Err(inconsistent(kind, format!("{name} is empty")));
                        }
                    }
                }
            };
            return Ok(Launch {
                kind,
                rank,
                size,
                rank_zero,
            });
        }
        Err(LaunchError::NoLauncher)
    }
}

fn inconsistent(launcher: LauncherKind, message: String) -> LaunchError {
    LaunchError::Inconsistent { launcher, message }
}

/// The value of `name` as a count or index; `None` when unset.
fn number(
    kind: LauncherKind,
    var: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<usize>, LaunchError> {
    let Some(text) = var(name) else {
        return Ok(None);
    };
    text.trim().parse::<usize>().map(Some).map_err(|_| {
        inconsistent(
            kind,
            format!(
                "{name}=\"{}\" is not a whole number",
                sideway::peer_text::printable(&text, 64)
            ),
        )
    })
}

/// The rank and world size from `rank_var` and `size_var`, both required, rank < size.
/// The most ranks a cluster run may have: what a launcher's size variable may say. A run is
/// a series of pairwise steps over every rank; far beyond this it would not finish, and a
/// larger number is a launcher's mistake (or a stray variable), refused before anything is
/// sized by it.
pub const MAX_RANKS: usize = HOST_LIST_MAX;

fn rank_and_size(
    kind: LauncherKind,
    var: &impl Fn(&str) -> Option<String>,
    rank_var: &str,
    size_var: &str,
) -> Result<(usize, usize), LaunchError> {
    let rank = number(kind, var, rank_var)?;
    let size = number(kind, var, size_var)?;
    match (rank, size) {
        (Some(rank), Some(0)) => Err(inconsistent(
            kind,
            format!("{size_var}=0 (rank {rank}): a run needs at least two ranks"),
        )),
        (Some(_), Some(size)) if size > MAX_RANKS => Err(inconsistent(
            kind,
            format!(
                "{size_var}={size} is more ranks than a cluster run takes (at most {MAX_RANKS})"
            ),
        )),
        (Some(rank), Some(size)) if rank >= size => Err(inconsistent(
            kind,
            format!("{rank_var}={rank} is not below {size_var}={size}"),
        )),
        (Some(rank), Some(size)) => Ok((rank, size)),
        (None, _) => Err(inconsistent(
            kind,
            format!("{size_var} is set but {rank_var} is not"),
        )),
        (_, None) => Err(inconsistent(
            kind,
            format!("{rank_var} is set but {size_var} is not"),
        )),
    }
}

/// Expands a Slurm host list: comma-separated hosts, each with any number of bracketed
/// ranges (`node[01-03,07]`, `rack[1-2]-n[1-4]`, `login1`); ranges keep the zero padding of
/// their lower bound. Order is kept and duplicates stay (as Slurm's own expansion).
pub fn parse_host_list(list: &str) -> Result<Vec<String>, HostListError> {
    // The list comes from the environment: what it quotes is made printable too.
    let fail = |message: String| HostListError {
        list: sideway::peer_text::printable(list, 200),
        message: sideway::peer_text::printable(&message, 400),
    };
    let mut hosts = Vec::new();
    for item in split_top_level(list).map_err(fail)? {
        if item.is_empty() {
            return Err(fail(
                "an empty host name (two commas, or one at an end)".into(),
            ));
        }
        let mut expanded = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let (literal, after) = match rest.find('[') {
                Some(open) => (&rest[..open], Some(&rest[open + 1..])),
                None => (rest, None),
            };
            if literal.contains(']') {
                return Err(fail(format!("\"{item}\" has a ']' without its '['")));
            }
            for host in &mut expanded {
                host.push_str(literal);
            }
            let Some(after) = after else { break };
            let close = after
                .find(']')
                .ok_or_else(|| fail(format!("\"{item}\" has a '[' without its ']'")))?;
            let values = expand_ranges(&after[..close]).map_err(fail)?;
            let total = expanded.len().saturating_mul(values.len());
            if hosts.len().saturating_add(total) > HOST_LIST_MAX {
                return Err(fail(format!("more than {HOST_LIST_MAX} hosts")));
            }
            expanded = expanded
                .iter()
                .flat_map(|h| values.iter().map(move |v| format!("{h}{v}")))
                .collect();
            rest = &after[close + 1..];
        }
        if hosts.len() + expanded.len() > HOST_LIST_MAX {
            return Err(fail(format!("more than {HOST_LIST_MAX} hosts")));
        }
        hosts.extend(expanded);
    }
    Ok(hosts)
}

/// The list's items: split at commas outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("brackets inside brackets".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a ']' without its '['".into()),
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            c if c.is_whitespace() && depth == 1 => return Err("a space inside brackets".into()),
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '[' without its ']'".into());
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// The values of one bracket's contents: `01-03,07` gives 01, 02, 03, 07.
fn expand_ranges(inside: &str) -> Result<Vec<String>, String> {
    let mut values = Vec::new();
    for part in inside.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!(
                "\"[{inside}]\": \"{part}\" is not a number or a range of numbers"
            ));
        }
        let parse = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| format!("\"{s}\" in \"[{inside}]\" is too large"))
        };
        let (a, b) = (parse(lo)?, parse(hi)?);
        if a > b {
            return Err(format!("\"[{inside}]\": the range {part} runs backwards"));
        }
        if b - a >= HOST_LIST_MAX as u64 || values.len() as u64 + (b - a) >= HOST_LIST_MAX as u64 {
            return Err(format!("more than {HOST_LIST_MAX} hosts"));
        }
        let width = lo.len();
        values.extend((a..=b).map(|v| format!("{v:0width$}")));
    }
    Ok(values)
}

/// This host's name, for the table and for messages about this rank.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch, LaunchError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Launch::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn host_lists_expand_as_slurm_does() {
        assert_eq!(
            parse_host_list("node[01-03,07]").unwrap(),
            ["node01", "node02", "node03", "node07"]
        );
        assert_eq!(
            parse_host_list("login1,gpu[8-10]-ib,x").unwrap(),
            ["login1", "gpu8-ib", "gpu9-ib", "gpu10-ib", "x"]
        );
        assert_eq!(
            parse_host_list("r[1-2]n[001-002]").unwrap(),
            ["r1n001", "r1n002", "r2n001", "r2n002"]
        );
        assert_eq!(parse_host_list("a[9-11]").unwrap(), ["a9", "a10", "a11"]);
        assert_eq!(parse_host_list("n[5]").unwrap(), ["n5"]);
        for (bad, says) in [
            ("node[01-03", "without its ']'"),
            ("node01-03]", "without its '['"),
            ("node[3-1]", "runs backwards"),
            ("node[a-b]", "is not a number"),
            ("node[]", "is not a number"),
            ("a,,b", "empty host name"),
            ("n[[1]]", "inside brackets"),
            ("n[0-999999999]", "more than 65536 hosts"),
            ("n[99999999999999999999]", "too large"),
            ("n[1-3]x[1-70000]", "more than 65536 hosts"),
        ] {
            let e = parse_host_list(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn each_launcher_is_read() {
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            // A daemon's Slurm variables under mpirun in an allocation are ignored.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap();
        assert_eq!(
            (l.kind, l.rank, l.size, l.rank_zero),
            (LauncherKind::OpenMpi, 2, 4, RankZeroHost::ThisHost)
        );
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ])
        .unwrap();
        assert!(matches!(l.rank_zero, RankZeroHost::Unknown(_)));
        let l = launch(&[("PMI_RANK", "0"), ("PMI_SIZE", "3")]).unwrap();
        assert_eq!((l.kind, l.rank, l.size), (LauncherKind::Pmi, 0, 3));
        let l = launch(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_NODELIST", "node[01-03,07]"),
            ("SLURM_JOB_NUM_NODES", "4"),
        ])
        .unwrap();
        assert_eq!(
            (l.kind, l.rank, l.size, l.rank_zero),
            (
                LauncherKind::Slurm,
                5,
                8,
                RankZeroHost::Node("node01".into())
            )
        );
        // The step's list wins over the job's.
        let l = launch(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "b[2-3]"),
            ("SLURM_JOB_NODELIST", "a[1-9]"),
        ])
        .unwrap();
        assert_eq!(l.rank_zero, RankZeroHost::Node("b2".into()));
    }

    #[test]
    fn missing_and_inconsistent_launchers_are_named() {
        let e = launch(&[]).unwrap_err().to_string();
        for name in ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "mpirun"] {
            assert!(e.contains(name), "{e}");
        }
        for (vars, says) in [
            (
                &[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")][..],
                "Open MPI: OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4",
            ),
            (
                &[("OMPI_COMM_WORLD_RANK", "1")][..],
                "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not",
            ),
            // A size no run has is refused before anything is sized by it (it aborted on a
            // failed allocation of a slot per rank).
            (
                &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "4000000000")][..],
                "OMPI_COMM_WORLD_SIZE=4000000000 is more ranks than a cluster run takes (at most 65536)",
            ),
            (
                &[("PMI_RANK", "0"), ("PMI_SIZE", "65537")][..],
                "PMI_SIZE=65537 is more ranks",
            ),
            (
                &[("PMI_RANK", "x"), ("PMI_SIZE", "2")][..],
                "PMI: PMI_RANK=\"x\" is not a whole number",
            ),
            (
                &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "0")][..],
                "SLURM_NTASKS=0",
            ),
            (
                &[
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "4"),
                    ("SLURM_NODELIST", "n[1-2]"),
                    ("SLURM_JOB_NUM_NODES", "3"),
                ][..],
                "names 2 hosts but SLURM_JOB_NUM_NODES=3",
            ),
            (
                &[
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_NODELIST", "n[1-3]"),
                ][..],
                "names 3 hosts but SLURM_NTASKS=2",
            ),
            (
                &[
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_NODELIST", "n[1-"),
                ][..],
                "SLURM_NODELIST: host list \"n[1-\"",
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "0"),
                    ("OMPI_COMM_WORLD_SIZE", "2"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
                ][..],
                "LOCAL_SIZE=3 is larger",
            ),
        ] {
            let e = launch(vars).unwrap_err().to_string();
            assert!(e.contains(says), "{vars:?}: {e}");
        }
    }
}
