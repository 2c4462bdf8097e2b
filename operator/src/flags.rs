//! Command-line flags both modes share: the overload limits of the API server, the controller's
//! thresholds, and the duration syntax of every duration flag.

use std::time::Duration;

use etcd_operator_apiserver::http::overload::OverloadOptions;

/// The API server's overload limits (kube-apiserver's flags of the same names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct OverloadArgs {
    /// Read-only requests (get, list, discovery) served at once; more are answered 429 with
    /// `Retry-After: 1`. Watches are not counted.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_requests_inflight: u32,
    /// Mutating requests (create, update, patch, delete) served at once; more are answered 429
    /// with `Retry-After: 1`.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_mutating_requests_inflight: u32,
    /// How long a request may take before it is answered 504 Timeout (watches and snapshot
    /// streams excepted), e.g. 60s or 2m.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub request_timeout: Duration,
}

impl OverloadArgs {
    /// The options of [`etcd_operator_apiserver::http::overload::limit`].
    pub fn options(&self) -> OverloadOptions {
        OverloadOptions {
            max_requests_inflight: self.max_requests_inflight as usize,
            max_mutating_requests_inflight: self.max_mutating_requests_inflight as usize,
            request_timeout: self.request_timeout,
        }
    }
}

/// The controller's operator-wide settings (both modes).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ControllerArgs {
    /// How long a member restarted on a new version may take to be healthy, caught up and
    /// reporting it before the roll halts (and the member goes back), e.g. 120s or 2m.
    #[arg(long, env = "ETCD_OPERATOR_UPGRADE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub upgrade_timeout: Duration,

    /// Manage EtcdClusters only in these namespaces (comma-separated; empty: every namespace).
    /// A namespace-scoped install grants the controller Roles there only; a cluster created
    /// elsewhere is stored but gets `Managed=False` and a Warning Event, and nothing is created
    /// for it.
    #[arg(long, env = "ETCD_OPERATOR_WATCH_NAMESPACES", value_delimiter = ',', num_args = 0..)]
    pub watch_namespaces: Vec<String>,

    /// Where the kubernetes runtime keeps the pre-upgrade snapshot of a cluster without a backup
    /// destination (`<dir>/<namespace>/<cluster>/`, the newest few kept): a volume of the
    /// operator's own Pod (the chart mounts its claim, or an emptyDir). Without it, such a
    /// snapshot is not taken. Local processes keep theirs beside the data either way.
    #[arg(long, env = "ETCD_OPERATOR_SNAPSHOT_DIR")]
    pub snapshot_dir: Option<std::path::PathBuf>,
}

impl Default for ControllerArgs {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            upgrade_timeout: etcd_operator_controller::plan::Thresholds::default().upgrade_timeout,
            watch_namespaces: Vec::new(),
            snapshot_dir: None,
        }
    }
}

impl ControllerArgs {
    /// The namespaces whose clusters are managed (empty: every namespace), without blanks.
    pub fn namespaces(&self) -> Vec<String> {
        let mut namespaces: Vec<String> = self
            .watch_namespaces
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        namespaces.sort();
        namespaces.dedup();
        namespaces
    }

    /// The planner's thresholds.
    pub fn thresholds(&self) -> etcd_operator_controller::plan::Thresholds {
        etcd_operator_controller::plan::Thresholds {
            upgrade_timeout: self.upgrade_timeout,
            ..Default::default()
        }
    }
}

/// A flag value that is not a duration [`parse_duration`] accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationFlagError {
    /// No number in front.
    #[error("invalid duration {0:?}: expected e.g. 30s, 5m, 1h")]
    Number(String),
    /// A unit other than `ms`, `s`, `m`, `h`.
    #[error("invalid duration unit in {0:?}: use ms, s, m or h")]
    Unit(String),
    /// Zero.
    #[error("invalid duration {0:?}: must be more than zero")]
    Zero(String),
}

/// Parses `250ms`, `30s`, `5m`, `1h` (a bare number is seconds); zero is refused.
pub fn parse_duration(s: &str) -> Result<Duration, DurationFlagError> {
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| DurationFlagError::Number(s.to_owned()))?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(DurationFlagError::Unit(s.to_owned())),
    };
    if duration.is_zero() {
        return Err(DurationFlagError::Zero(s.to_owned()));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        overload: OverloadArgs,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn defaults_are_kube_apiservers() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.overload.options(), OverloadOptions::default());
    }

    #[test]
    fn limits_are_set_and_zero_is_refused() {
        let cli = Cli::try_parse_from([
            "x",
            "--max-requests-inflight=7",
            "--max-mutating-requests-inflight=3",
            "--request-timeout=2m",
        ])
        .unwrap();
        assert_eq!(
            cli.overload.options(),
            OverloadOptions {
                max_requests_inflight: 7,
                max_mutating_requests_inflight: 3,
                request_timeout: Duration::from_secs(120),
            }
        );
        assert!(Cli::try_parse_from(["x", "--max-mutating-requests-inflight=0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--request-timeout=0s"]).is_err());
    }
}
