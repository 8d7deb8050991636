//! What a verb's command runs: one side of a pair test ([`crate::engine`]), or with
//! `--cluster` one rank of a cluster run ([`crate::cluster`], which runs its pairs with the
//! engine). The choice is made here, above both, so that the engine knows nothing of
//! cluster runs.

use crate::cli::{RunArgs, Verb};
use crate::cluster;
use crate::engine::{self, RunError};

/// Runs one side of a test: the server when `args.server` is `None`; a rank of a cluster
/// run with `--cluster`. Cluster options without `--cluster` are refused first.
pub fn run(verb: Verb, args: &RunArgs) -> Result<(), RunError> {
    cluster::check_args(args)?;
    if args.cluster.cluster {
        return cluster::run(verb, args);
    }
    engine::run_pair(verb, args)
}
