//! Cluster mode: one stride-perf invocation per rank, started by `srun` or `mpirun`, tests a
//! whole set of hosts, pair by pair or all at once.
//!
//! A run goes: each rank reads its rank and the world size from the launcher's environment
//! ([`launcher`]); rank 0 listens at the rendezvous address and runs the coordinator
//! ([`coordinator`]); every rank (rank 0 too) connects to it and registers its host, device,
//! GID and the address of its pair listener; rank 0 sends everyone the table, then the steps
//! of the pattern, one at a time. In a step every rank runs its pairs at once, each with the
//! pair engine of `stride-perf` (the same parameters, verbs and buffers as a pair run; the
//! client of the pair connects to the server's pair listener), and reports the results of the
//! pairs it initiated. Rank 0 prints one report for the whole run and writes its JSON and
//! heatmap ([`report`], [`heatmap`]).
//!
//! Bounded: ranks and rank 0 trade heartbeats every second; a rank that closes its
//! connection (it died), stays silent for `--cluster-timeout`, fails a pair, or never
//! arrives ends the run on every rank, and the message names its rank, host and process.

pub mod coordinator;
pub mod heatmap;
pub mod launcher;
mod member;
pub mod report;
pub mod wire;

pub use crate::cli::{ClusterArgs, Pattern};
use crate::cli::{RunArgs, Verb};
use crate::engine::RunError;
use launcher::{Launch, RankZeroHost};
use wire::PairJob;

// The command line names the pattern (`Pattern` is in `crate::cli`, which knows nothing of
// cluster runs); cluster mode knows which pairs each one runs.
impl Pattern {
    /// The steps of the pattern for `size` ranks: each step's pairs run at once, the steps
    /// one after another.
    pub fn steps(self, size: usize) -> Vec<Vec<PairJob>> {
        let ordered = || {
            (0..size).flat_map(move |client| {
                (0..size)
                    .filter(move |&server| server != client)
                    .map(move |server| PairJob { client, server })
            })
        };
        match self {
            Pattern::Pairs => ordered().map(|job| vec![job]).collect(),
            Pattern::Ring => vec![(0..size)
                .map(|client| PairJob {
                    client,
                    server: (client + 1) % size,
                })
                .collect()],
            Pattern::AllToAll => vec![ordered().collect()],
        }
    }
}

/// Refuses cluster options given without `--cluster`, and pair options that a cluster run
/// cannot honour.
pub fn check_args(args: &RunArgs) -> Result<(), RunError> {
    let c = &args.cluster;
    if !c.cluster {
        let stray = [
            (c.pattern != Pattern::Pairs, "--pattern"),
            (c.rendezvous.is_some(), "--rendezvous"),
            (c.cluster_timeout != 30, "--cluster-timeout"),
            (c.heatmap.is_some(), "--heatmap"),
        ];
        if let Some((_, flag)) = stray.iter().find(|(set, _)| *set) {
            return Err(RunError::usage(format!(
                "{flag} applies to cluster runs only: add --cluster"
            )));
        }
        return Ok(());
    }
    if args.rdma_cm {
        return Err(RunError::usage(
            "-R (rdma_cm) is not supported with --cluster: a cluster's pairs trade their \
             endpoints over TCP; drop -R",
        ));
    }
    Ok(())
}

/// Where this rank finds rank 0: `--rendezvous`, else the launcher's word, at the -p port.
pub fn rendezvous_address(args: &RunArgs, launch: &Launch) -> Result<String, RunError> {
    if let Some(given) = &args.cluster.rendezvous {
        let port_ok = given
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(RunError::usage(format!(
                "--rendezvous {given}: expected HOST:PORT (e.g. node01:18515, or [::1]:18515)"
            )));
        }
        // Port 0 would let rank 0 listen on a port the system picks, which no other rank
        // can know: every other rank would wait in vain.
        if given
            .rsplit_once(':')
            .is_some_and(|(_, port)| port.parse() == Ok(0u16))
        {
            return Err(RunError::usage(format!(
                "--rendezvous {given}: port 0 lets the system pick rank 0's port, which the \
                 other ranks cannot know; name a free TCP port (1-65535)"
            )));
        }
        return Ok(given.clone());
    }
    let port = args.port;
    match &launch.rank_zero {
        RankZeroHost::ThisHost => Ok(format!("127.0.0.1:{port}")),
        RankZeroHost::Node(host) => Ok(format!("{host}:{port}")),
        RankZeroHost::Unknown(why) => Err(RunError::usage(format!(
            "{why}: pass --rendezvous HOST:PORT naming rank 0's host (the first host of \
             mpirun's host list) and a free TCP port"
        ))),
    }
}

/// Runs this process's rank of a cluster run.
pub fn run(verb: Verb, args: &RunArgs) -> Result<(), RunError> {
    check_args(args)?;
    let launch = Launch::from_env().map_err(|e| RunError::usage(e.to_string()))?;
    if launch.size < 2 {
        return Err(RunError::usage(format!(
            "{}: the run has {} rank; a cluster run needs at least two (srun -n 2, mpirun -np \
             2)",
            launch.kind, launch.size
        )));
    }
    // Bad options fail here, on every rank, before anyone waits for anyone.
    crate::params::TestParams::resolve(verb, args)?;
    let rendezvous = rendezvous_address(args, &launch)?;
    member::run(verb, args, &launch, &rendezvous)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(argv: &[&str]) -> RunArgs {
        let mut full = vec!["stride-perf"];
        full.extend_from_slice(argv);
        let cli = crate::cli::Cli::try_parse_from(full).unwrap();
        cli.command.run_args().unwrap().1.clone()
    }

    #[test]
    fn patterns_cover_their_pairs() {
        let pairs = Pattern::Pairs.steps(3);
        assert_eq!(pairs.len(), 6);
        assert!(pairs.iter().all(|s| s.len() == 1));
        let ring = Pattern::Ring.steps(4);
        assert_eq!(ring.len(), 1);
        assert_eq!(
            ring[0]
                .iter()
                .map(|j| (j.client, j.server))
                .collect::<Vec<_>>(),
            [(0, 1), (1, 2), (2, 3), (3, 0)]
        );
        let all = Pattern::AllToAll.steps(4);
        assert_eq!((all.len(), all[0].len()), (1, 12));
    }

    #[test]
    fn cluster_options_need_cluster_and_refuse_rdma_cm() {
        assert!(check_args(&args(&["write", "bw"])).is_ok());
        let e = check_args(&args(&["write", "bw", "--pattern", "ring"])).unwrap_err();
        assert_eq!(
            e,
            RunError::Usage("--pattern applies to cluster runs only: add --cluster".into())
        );
        let e = check_args(&args(&["write", "bw", "--cluster", "-R"])).unwrap_err();
        assert!(matches!(e, RunError::Usage(_)), "{e:?}");
        assert!(
            e.to_string().contains("-R (rdma_cm) is not supported"),
            "{e}"
        );
        let a = args(&["write", "bw", "--cluster", "--pattern", "all-to-all"]);
        assert_eq!(a.cluster.pattern, Pattern::AllToAll);
        let full = ["stride-perf", "write", "bw", "--cluster", "10.0.0.1"];
        assert!(crate::cli::Cli::try_parse_from(full).is_err());
        let short = [
            "stride-perf",
            "write",
            "bw",
            "--cluster",
            "--cluster-timeout",
            "1",
        ];
        assert!(crate::cli::Cli::try_parse_from(short).is_err());
    }

    #[test]
    fn the_rendezvous_comes_from_the_option_or_the_launcher() {
        let launch = |rank_zero| Launch {
            kind: launcher::LauncherKind::Slurm,
            rank: 1,
            size: 2,
            rank_zero,
        };
        let a = args(&["write", "bw", "--cluster", "-p", "9000"]);
        assert_eq!(
            rendezvous_address(&a, &launch(RankZeroHost::Node("n01".into()))).unwrap(),
            "n01:9000"
        );
        assert_eq!(
            rendezvous_address(&a, &launch(RankZeroHost::ThisHost)).unwrap(),
            "127.0.0.1:9000"
        );
        let e = rendezvous_address(&a, &launch(RankZeroHost::Unknown("no idea".into())))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("no idea: pass --rendezvous HOST:PORT"), "{e}");
        let a = args(&["write", "bw", "--cluster", "--rendezvous", "[::1]:7000"]);
        assert_eq!(
            rendezvous_address(&a, &launch(RankZeroHost::ThisHost)).unwrap(),
            "[::1]:7000"
        );
        let a = args(&["write", "bw", "--cluster", "--rendezvous", "n01:0"]);
        let e = rendezvous_address(&a, &launch(RankZeroHost::ThisHost))
            .unwrap_err()
            .to_string();
        assert!(e.contains("port 0"), "{e}");
        for bad in ["n01", "n01:x", ":5", "n01:70000", "[::1]:0"] {
            let a = args(&["write", "bw", "--cluster", "--rendezvous", bad]);
            assert!(
                matches!(
                    rendezvous_address(&a, &launch(RankZeroHost::ThisHost)),
                    Err(RunError::Usage(_))
                ),
                "{bad}"
            );
        }
    }
}
