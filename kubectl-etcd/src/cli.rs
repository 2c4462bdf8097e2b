//! The command line: global kubectl-style flags and one subcommand per day-2 task (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// What `--help` says after the subcommands: the exit codes scripts can rely on.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  done (or nothing to do)
  1  error: the API refused or failed, the object or a member does not exist, a snapshot failed
     its checksum, a file could not be written
  2  usage: unknown subcommand or flag, missing argument
  3  refused: a disruptive command was not confirmed (no terminal to ask on and no --yes, or the
     answer was not \"yes\"), or it would have no effect now; nothing was changed

Every command works through the EtcdCluster API (an annotation, the /snapshot subresource), so it
works through the aggregator and against `etcd-operator local` alike; none talks to etcd itself.";

/// `kubectl etcd`: day-2 commands for EtcdClusters (etcd.operator.dev).
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-etcd",
    bin_name = "kubectl etcd",
    version,
    about = "Day-2 commands for EtcdClusters (etcd.operator.dev), through the Kubernetes API",
    after_help = EXIT_CODES_HELP
)]
pub struct Cli {
    /// Connection flags, as kubectl takes them.
    #[command(flatten)]
    pub global: Global,
    /// The task.
    #[command(subcommand)]
    pub command: Command,
}

/// The flags every subcommand takes, with kubectl's names.
#[derive(Debug, Clone, Default, Args)]
pub struct Global {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace of the EtcdCluster (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the members (id, leader, learner, version, health, database size and use, alarms),
    /// the conditions and the last backup.
    Status {
        /// The EtcdCluster.
        name: String,
    },
    /// Save a fresh snapshot of the cluster (the /snapshot subresource) to a file, checked
    /// against the SHA-256 the server sends after it; the file appears only when it is whole.
    Snapshot {
        /// The EtcdCluster.
        name: String,
        /// The file to write.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Keep a snapshot even when the server sent no SHA-256 to check it against (a proxy on
        /// the way that drops HTTP trailers).
        #[arg(long)]
        allow_unverified: bool,
    },
    /// Defragment every member now, one at a time, followers first and the leader after a
    /// leadership move (annotation etcd.operator.dev/defragment).
    Defrag {
        /// The EtcdCluster.
        name: String,
    },
    /// Replace a member by a fresh one that joins as a learner, under the controller's safety
    /// rules (annotation etcd.operator.dev/replace-member).
    ReplaceMember {
        /// The EtcdCluster.
        name: String,
        /// The member to replace (as `status` lists it).
        member: String,
    },
    /// Issue every member's certificates again and restart the members on them, one at a time
    /// (annotation etcd.operator.dev/rotate-certificates).
    RotateCerts {
        /// The EtcdCluster.
        name: String,
    },
    /// Hand raft leadership to a voting member (annotation etcd.operator.dev/move-leader).
    MoveLeader {
        /// The EtcdCluster.
        name: String,
        /// The member to lead.
        member: String,
    },
    /// Rebuild a cluster that lost quorum from one surviving member, giving up what the others
    /// had (annotation etcd.operator.dev/recover-quorum). Shows what will be lost and asks for
    /// confirmation.
    RecoverQuorum {
        /// The EtcdCluster.
        name: String,
        /// The member to rebuild from (default: the running member that applied the most).
        #[arg(long, value_name = "MEMBER")]
        survivor: Option<String>,
        /// Do not ask: confirm on the command line.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Print the ETCDCTL_* environment for the cluster (`eval "$(kubectl etcd endpoints NAME)"`),
    /// with the client certificate files when its client plane uses TLS and they are at hand.
    Endpoints {
        /// The EtcdCluster.
        name: String,
        /// Where the cluster's client certificate files are (`ca.crt`-like trust bundle, client
        /// certificate and key). Default for `etcd-operator local`: found beside the kubeconfig
        /// it wrote, under `members/<namespace>/<name>/pki`.
        #[arg(long, value_name = "DIR")]
        pki_dir: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "kubectl-etcd",
            "-n",
            "prod",
            "status",
            "demo",
            "--context",
            "kind",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("prod"));
        assert_eq!(cli.global.context.as_deref(), Some("kind"));
        assert!(matches!(cli.command, Command::Status { ref name } if name == "demo"));
    }

    #[test]
    fn recover_quorum_takes_a_survivor_and_yes() {
        let cli = Cli::try_parse_from([
            "kubectl-etcd",
            "recover-quorum",
            "demo",
            "--survivor",
            "demo-abcde",
            "--yes",
        ])
        .unwrap();
        let Command::RecoverQuorum { survivor, yes, .. } = cli.command else {
            unreachable!("parsed as another subcommand")
        };
        assert_eq!(survivor.as_deref(), Some("demo-abcde"));
        assert!(yes);
    }

    #[test]
    fn a_missing_argument_is_a_usage_error() {
        let e = Cli::try_parse_from(["kubectl-etcd", "snapshot", "demo"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = Cli::try_parse_from(["kubectl-etcd", "frobnicate"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }
}
