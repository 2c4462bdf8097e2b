//! `etcd-operator`: the API server and controller in one process.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use etcd_operator::flags::{ControllerArgs, OverloadArgs, parse_duration};
use etcd_operator::local;
use etcd_operator_apiserver::http::{self, AppState, Stores, auth, openapi};
use etcd_operator_apiserver::registry::kind;
use etcd_operator_apiserver::serve;
use etcd_operator_apiserver::storage::{ConsistencyMode, Storage, StorageOptions};

/// jemalloc instead of glibc's malloc: allocation was a third of the server's CPU on the write
/// path, and glibc kept the memory of deleted objects; jemalloc's background threads give freed
/// pages back (mimalloc, also measured, kept twice the idle memory: docs/performance.md).
/// Its options (1 s decay, one arena) are built into it from `.cargo/config.toml`, and its own
/// figures are at `/metrics` (`allocator`). The `system-allocator` feature keeps glibc's, for
/// heap profilers that hook malloc.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "etcd-operator",
    version,
    about = "Aggregated Kubernetes API server and controller for etcd clusters"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

/// Flags of `etcd-operator local`.
#[derive(Debug, clap::Args)]
struct LocalArgs {
    /// Directory holding the backing etcd, certificates, the kubeconfig and member data.
    #[arg(long, default_value = ".local")]
    state_dir: std::path::PathBuf,
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "127.0.0.1:8443")]
    listen: std::net::SocketAddr,
    /// The etcd binary for the backing etcd (default: $ETCD_OPERATOR_ETCD, then
    /// .tools/etcd/3.5.34/etcd found from here upwards, then `etcd` on the PATH).
    #[arg(long)]
    etcd_binary: Option<std::path::PathBuf>,
    /// Directory of etcd binaries for cluster members, as `<dir>/<version>/etcd` (default:
    /// the directory two levels above the backing etcd binary, i.e. `.tools/etcd`).
    #[arg(long)]
    etcd_binaries: Option<std::path::PathBuf>,
    /// How often the backing etcd is compacted (kube-apiserver: 5 minutes).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    compaction_interval: Duration,
    /// A file with S3 credentials for backups (`AWS_ACCESS_KEY_ID=...` and
    /// `AWS_SECRET_ACCESS_KEY=...` lines), used when the environment has no
    /// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`.
    #[arg(long, env = "ETCD_OPERATOR_S3_CREDENTIALS_FILE")]
    backup_credentials_file: Option<std::path::PathBuf>,
    /// Run members as Pods of the Kubernetes cluster this kubeconfig reaches (the kubernetes
    /// runtime, as `serve` uses) instead of local processes. For development and tests: the
    /// controller connects to members by their `<member>.<cluster>.<namespace>.svc` names,
    /// which must resolve from this machine.
    #[arg(long)]
    member_kubeconfig: Option<std::path::PathBuf>,
    /// The API server's overload limits.
    #[command(flatten)]
    overload: OverloadArgs,
    /// The controller's thresholds.
    #[command(flatten)]
    controller: ControllerArgs,
    /// Serve the API alone, without the co-located controllers (the API server's benchmark
    /// measures the server's own cost this way, beside a run with them).
    #[arg(long, env = "ETCD_OPERATOR_NO_CONTROLLER", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::FalseyValueParser::new())]
    no_controller: bool,
    /// For fault-injection tests: each new member advertises its peer URL on a port of its own
    /// (`advertisePeerPort` in its `member.json`) while it listens on `peerPort`; the test puts a
    /// proxy between the two. Without one, members cannot reach each other.
    #[arg(long, env = "ETCD_OPERATOR_PEER_PROXY_PORTS", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::FalseyValueParser::new(), hide = true)]
    peer_proxy_ports: bool,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Run locally: a backing etcd, the API server and the controller with the local-process runtime.
    Local(LocalArgs),
    /// Run inside a Kubernetes cluster behind the kube-apiserver aggregator.
    Serve(etcd_operator::serve_mode::ServeArgs),
    /// Restore step 1, run by an init container of a member Pod restored from a snapshot: fetch
    /// the snapshot of a restore plan (S3 keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY),
    /// verify its checksums and write it for the etcd image's restore tool.
    #[command(hide = true)]
    FetchSnapshot {
        /// The restore plan as JSON (what the member configuration records).
        #[arg(long)]
        plan: String,
        /// etcd's data directory: when it holds a member and the snapshot file exists, nothing
        /// is fetched.
        #[arg(long)]
        data_dir: std::path::PathBuf,
        /// Where the verified snapshot is written.
        #[arg(long)]
        snapshot: std::path::PathBuf,
        /// Where the restore tool writes the member (cleared first).
        #[arg(long)]
        staging: std::path::PathBuf,
        /// Where the claim of a `volume.claimName` snapshot is mounted.
        #[arg(long)]
        claim_dir: Option<std::path::PathBuf>,
    },
    /// Restore step 3, after the restore tool: move the restored member into the data directory
    /// unless it holds one already.
    #[command(hide = true)]
    FinishRestore {
        /// etcd's data directory.
        #[arg(long)]
        data_dir: std::path::PathBuf,
        /// Where the restore tool wrote the member.
        #[arg(long)]
        staging: std::path::PathBuf,
    },
}

/// A restore step inside a member Pod failed.
#[derive(Debug, thiserror::Error)]
enum RestoreStepError {
    #[error("--plan is not a restore plan")]
    Plan(#[from] serde_json::Error),
    #[error(transparent)]
    Restore(#[from] etcd_operator_controller::restore::RestoreError),
}

async fn fetch_snapshot(
    plan: &str,
    data_dir: &std::path::Path,
    snapshot: &std::path::Path,
    staging: &std::path::Path,
    claim_dir: Option<&std::path::Path>,
) -> Result<(), RestoreStepError> {
    use etcd_operator_controller::restore::{self, PodFetch};
    let plan: restore::RestorePlan = serde_json::from_str(plan)?;
    match restore::fetch_for_pod(&plan, data_dir, snapshot, staging, claim_dir).await? {
        PodFetch::Fetched { location, sha256 } => {
            tracing::info!(%location, %sha256, snapshot = %snapshot.display(), "fetched and verified the snapshot");
        }
        PodFetch::Kept => {
            tracing::info!(data_dir = %data_dir.display(), "the data directory holds a member already; the snapshot was not fetched again");
        }
    }
    Ok(())
}

async fn finish_restore(
    data_dir: &std::path::Path,
    staging: &std::path::Path,
) -> Result<(), RestoreStepError> {
    use etcd_operator_controller::restore::{self, PodFinish};
    match restore::finish_for_pod(data_dir, staging).await? {
        PodFinish::Restored => {
            tracing::info!(data_dir = %data_dir.display(), "restored member moved into place")
        }
        PodFinish::AlreadyRestored => {
            tracing::info!(data_dir = %data_dir.display(), "the data directory holds a member already; kept it")
        }
    }
    Ok(())
}

/// How long an Event lives after its last write in local mode: kube-apiserver's default
/// `--event-ttl`.
const EVENT_TTL: Duration = Duration::from_secs(3600);

/// Where Kubernetes reads a container's termination message (the Pod's default path).
const TERMINATION_LOG: &str = "/dev/termination-log";

/// Runs a restore step. Its error becomes the container's termination message (written to
/// [`TERMINATION_LOG`] when that exists, and the last line of output for the Pod's
/// `FallbackToLogsOnError`), which the operator reports.
fn restore_step(
    runtime: &tokio::runtime::Runtime,
    step: impl std::future::Future<Output = Result<(), RestoreStepError>>,
) -> ExitCode {
    match runtime.block_on(step) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("restore step failed");
            if std::path::Path::new(TERMINATION_LOG).is_file() {
                // Best effort: the log line below carries the same text.
                let _ = std::fs::write(TERMINATION_LOG, etcd_operator_api::report::chain(&error));
            }
            eprintln!("{}", etcd_operator_api::report::Chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// Running local mode failed.
#[derive(Debug, thiserror::Error)]
enum LocalModeError {
    #[error("prepare local mode")]
    Prepare(#[from] local::LocalError),
    #[error("start storage")]
    Storage(#[from] etcd_operator_apiserver::storage::StorageError),
    #[error(transparent)]
    OpenApi(#[from] openapi::OpenApiGenerateError),
    #[error("serve HTTPS")]
    Serve(#[from] serve::ServeError),
    #[error("build the controller's client: {0}")]
    ControllerClient(String),
    #[error("build the client of the members' cluster from {}: {reason}", path.display())]
    MemberCluster {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// The client for `--member-kubeconfig`'s cluster.
async fn member_cluster_client(path: &std::path::Path) -> Result<kube::Client, LocalModeError> {
    let err = |e: &dyn std::fmt::Display| LocalModeError::MemberCluster {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| err(&e))?;
    kube::Client::try_from(config).map_err(|e| err(&e))
}

/// The controller's client of local mode: in process, as the controller's certificate identity
/// (the identity it would present over loopback HTTPS), on `app`.
fn controller_client(
    app: axum::Router,
    identity: &local::kubeconfig::ClientIdentity,
) -> Result<kube::Client, serve::in_process::InProcessCertificateError> {
    let service = serve::InProcess::from_pem(app, &identity.cert_pem)?;
    Ok(kube::Client::new(service, "default"))
}

/// The member controller of local mode on `runtime` (local processes, or Pods with
/// `--member-kubeconfig`), on `clusters`, until `stopped`.
fn spawn_member_controller<R: etcd_operator_controller::runtime::Runtime>(
    runtime: R,
    clusters: kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>,
    members: &etcd_operator_controller::member_ops::EtcdClient,
    (credentials, metrics): (
        &etcd_operator_controller::backup::Credentials,
        &etcd_operator_controller::metrics::ControllerMetrics,
    ),
    (client, controller): (&kube::Client, &ControllerArgs),
    stopped: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let ctx = etcd_operator_controller::reconcile::Context::with_member_ops(
        client.clone(),
        runtime,
        controller.thresholds(),
        members.clone(),
    )
    .with_backup_credentials(credentials.clone())
    .with_metrics(metrics.clone())
    .with_namespaces(controller.namespaces());
    tokio::spawn(etcd_operator_controller::reconcile::run_on(
        ctx, clusters, stopped,
    ))
}

/// What local mode's new objects get: the controller's cleanup finalizer and first status when
/// it runs in this process (for the namespaces it manages), nothing with `--no-controller`
/// (nothing would remove the finalizer, and deletes would hang; nothing would keep the status).
fn controller_init(
    no_controller: bool,
    controller: &ControllerArgs,
) -> Arc<[etcd_operator_apiserver::registry::controller_init::ControllerInit]> {
    if no_controller {
        return Arc::new([]);
    }
    etcd_operator::controller_init::for_controller(controller)
}

async fn run_local(args: LocalArgs) -> Result<(), LocalModeError> {
    let LocalArgs {
        state_dir,
        listen,
        etcd_binary,
        etcd_binaries,
        compaction_interval,
        backup_credentials_file,
        member_kubeconfig,
        overload,
        controller,
        no_controller,
        peer_proxy_ports,
    } = args;
    serve::install_crypto_provider();
    // Checked before anything starts: a kubeconfig that does not load stops local mode at once.
    let member_kubeconfig = match member_kubeconfig {
        Some(path) => {
            let kube = member_cluster_client(&path).await?;
            Some((path, kube))
        }
        None => None,
    };
    let binaries = match etcd_binaries {
        Some(dir) => dir,
        None => local::backing_etcd::EtcdSearch::from_environment(etcd_binary.clone())
            .find()
            .ok()
            .and_then(|bin| Some(bin.parent()?.parent()?.to_path_buf()))
            .unwrap_or_else(|| state_dir.join("bin")),
    };
    let members_dir = state_dir.join("members");
    let env = local::prepare(local::LocalOptions {
        state_dir,
        listen,
        etcd_binary,
    })
    .await?;
    // Local mode is the only writer of its backing etcd: reads need no etcd round trip.
    let options = StorageOptions {
        consistency: ConsistencyMode::SingleWriter,
        ..StorageOptions::default()
    };
    // Local mode also serves core Events (there is no kube-apiserver to hold the controller's):
    // they expire an hour after their last write, kube-apiserver's default `--event-ttl`.
    let stores = Stores::open_kinds(&kind::ALL, |prefix| {
        let options = if prefix == kind::Kind::EVENT.info().storage_prefix {
            StorageOptions {
                ttl: Some(EVENT_TTL),
                ..options.clone()
            }
        } else {
            options.clone()
        };
        Storage::new(env.etcd_client.clone(), prefix, options)
    })
    .await?;
    // Compaction is of the whole backing etcd: one compactor, on any resource's storage.
    let compactor = stores
        .all()
        .next()
        .map(|storage| storage.spawn_compactor(compaction_interval));
    // One set of member connections for the controller, the backups and `/snapshot`.
    let members = etcd_operator_controller::member_ops::EtcdClient::default();
    // One registry for the process: the API server's and the controllers' series, at /metrics.
    let mut registry = prometheus_client::registry::Registry::default();
    let api_metrics = http::metrics::ApiMetrics::register(&mut registry);
    let controller_metrics = etcd_operator_controller::metrics::ControllerMetrics::register(&mut registry);
    #[cfg(not(feature = "system-allocator"))]
    etcd_operator::allocator::JemallocStats::register(&mut registry);
    let state = AppState {
        stores,
        authenticator: Arc::new(auth::LocalAuthenticator),
        authorizer: Arc::new(auth::AllowAuthenticated),
        openapi: Arc::new(openapi::Documents::generate()?),
        snapshots: Some(Arc::new(etcd_operator::snapshots::MemberSnapshots::new(
            members.clone(),
        ))),
        // Local mode has no Namespace objects: any DNS-1123 label is one (docs/api.md).
        namespaces: None,
        metrics: Some(Arc::new(registry)),
        controller_init: controller_init(no_controller, &controller),
    };
    let router = http::router(state);
    // The controller's requests are counted too, as kube-apiserver counts its loopback client's,
    // and not refused for overload, as kube-apiserver exempts that client.
    let in_process = http::metrics::instrument(router.clone(), api_metrics.clone());
    // Outermost: the overload refusals (429, 504) are counted too.
    let app = http::metrics::instrument(http::overload::limit(router, overload.options()), api_metrics);
    tracing::info!(
        url = %env.server_url,
        kubeconfig = %env.kubeconfig_path.display(),
        "etcd-operator local is serving; try: KUBECONFIG={} kubectl get etcdclusters",
        env.kubeconfig_path.display()
    );
    // The controller reaches the API in process, as its own client certificate's identity: no
    // TLS, socket or HTTP framing between it and the router (`serve::in_process`).
    let controller_client = controller_client(in_process, &env.controller_identity)
        .map_err(|e| LocalModeError::ControllerClient(etcd_operator_api::report::chain(&e)))?;
    // S3 keys for backups and for restores: the environment, else the credentials file.
    let credentials = etcd_operator_controller::backup::Credentials::Environment {
        file: backup_credentials_file,
    };
    let (stop_controller, controller_stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = controller_stopped.await;
    };
    // One watch and store of the EtcdClusters for the member and the backup controllers.
    let clusters = etcd_operator_controller::cluster_watch::shared(kube::Api::all(controller_client.clone()));
    let (stop_watch, watch_stopped) = tokio::sync::oneshot::channel::<()>();
    let watch = if no_controller {
        tokio::spawn(async {})
    } else {
        let shared = clusters.watch;
        tokio::spawn(async move {
            tokio::select! {
                () = shared => {}
                _ = watch_stopped => {}
            }
        })
    };
    let controller = match member_kubeconfig {
        _ if no_controller => {
            tracing::info!("no controller (--no-controller): serving the API alone");
            tokio::spawn(async {})
        }
        None => spawn_member_controller(
            {
                let runtime =
                    etcd_operator_controller::runtime::local::LocalRuntime::new(members_dir, binaries)
                        .with_restore_credentials(credentials.clone())
                        // Events go to this server, which serves core Events in local mode.
                        .with_events(controller_client.clone());
                if peer_proxy_ports {
                    tracing::warn!(
                        "members advertise separate peer ports (--peer-proxy-ports): a test proxy must forward them"
                    );
                    runtime.with_separate_advertised_peer_ports()
                } else {
                    runtime
                }
            },
            clusters.members,
            &members,
            (&credentials, &controller_metrics),
            (&controller_client, &controller),
            stopped,
        ),
        Some((path, kube)) => {
            tracing::info!(kubeconfig = %path.display(), "members run as Pods of the cluster of this kubeconfig");
            spawn_member_controller(
                etcd_operator_controller::runtime::kubernetes::KubernetesRuntime::new(kube)
                    .with_namespaces(controller.namespaces())
                    .with_snapshot_dir(controller.snapshot_dir.clone()),
                clusters.members,
                &members,
                (&credentials, &controller_metrics),
                (&controller_client, &controller),
                stopped,
            )
        }
    };
    // The backup controllers (scheduled snapshots, EtcdBackups) run beside the member controller.
    let backup_ctx = etcd_operator_controller::backup::BackupContext::new(controller_client, credentials)
        .with_member_ops(members)
        .with_metrics(controller_metrics);
    let (stop_backups, backups_stopped) = tokio::sync::oneshot::channel::<()>();
    let backups_stopped = async move {
        let _ = backups_stopped.await;
    };
    let backup_controllers = if no_controller {
        tokio::spawn(async {})
    } else {
        tokio::spawn(etcd_operator_controller::backup::run_on(
            backup_ctx,
            Some(clusters.backups),
            backups_stopped,
        ))
    };
    // On Ctrl-C the controllers stop first (their watches and requests are in process and hold
    // no connection, but they write to the storage the server is about to leave); then the
    // server drains its clients' connections and stops.
    let shutdown = async move {
        serve::shutdown_signal().await;
        let _ = stop_controller.send(());
        let _ = stop_backups.send(());
        let _ = stop_watch.send(());
        if tokio::time::timeout(Duration::from_secs(5), watch).await.is_err() {
            tracing::warn!("the EtcdCluster watch did not stop within 5 s");
        }
        if tokio::time::timeout(Duration::from_secs(5), backup_controllers)
            .await
            .is_err()
        {
            tracing::warn!("the backup controllers did not stop within 5 s");
        }
        // Members keep running (like Pods when a controller stops); only the server goes away.
        if tokio::time::timeout(Duration::from_secs(5), controller)
            .await
            .is_err()
        {
            tracing::warn!("the controller did not stop within 5 s");
        }
    };
    let served = serve::serve(env.listener, env.tls, app, shutdown).await;
    if let Some(compactor) = compactor {
        compactor.abort();
    }
    tracing::info!("stopping the backing etcd");
    if let Err(error) = env.backing_etcd.shutdown().await {
        tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "stop the backing etcd");
    }
    served?;
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: Pod logs, files and termination messages stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(error) => {
            tracing::error!(error = %etcd_operator_api::report::Chain(&error), "start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match cli.mode {
        Mode::Local(args) => match runtime.block_on(run_local(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(error = %etcd_operator_api::report::Chain(&error), "etcd-operator local failed");
                ExitCode::FAILURE
            }
        },
        Mode::FetchSnapshot {
            plan,
            data_dir,
            snapshot,
            staging,
            claim_dir,
        } => restore_step(
            &runtime,
            fetch_snapshot(&plan, &data_dir, &snapshot, &staging, claim_dir.as_deref()),
        ),
        Mode::FinishRestore { data_dir, staging } => {
            restore_step(&runtime, finish_restore(&data_dir, &staging))
        }
        Mode::Serve(args) => match runtime.block_on(etcd_operator::serve_mode::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(error = %etcd_operator_api::report::Chain(&error), "etcd-operator serve failed");
                ExitCode::FAILURE
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restore_steps_parse_as_the_member_pod_calls_them() {
        let cli = Cli::try_parse_from([
            "etcd-operator",
            "fetch-snapshot",
            "--plan",
            r#"{"source":{"url":"https://x/s.db"}}"#,
            "--data-dir",
            "/var/lib/etcd/data",
            "--snapshot",
            "/var/lib/etcd/restore/snapshot.db",
            "--staging",
            "/var/lib/etcd/restore/data",
        ])
        .unwrap();
        assert!(matches!(cli.mode, Mode::FetchSnapshot { ref plan, .. } if plan.contains("https://x/s.db")));
        let cli = Cli::try_parse_from([
            "etcd-operator",
            "finish-restore",
            "--data-dir",
            "/d",
            "--staging",
            "/s",
        ])
        .unwrap();
        assert!(matches!(cli.mode, Mode::FinishRestore { .. }));
    }

    #[test]
    fn new_clusters_get_the_cleanup_finalizer_and_first_status_only_with_the_controller() {
        assert!(controller_init(true, &ControllerArgs::default()).is_empty());
        let every = controller_init(false, &ControllerArgs::default());
        assert_eq!(every.len(), 1);
        assert_eq!(every[0].finalizer(), etcd_operator_api::CLEANUP_FINALIZER);
        assert!(every[0].namespaces().is_empty());
        assert!(every[0].sets_status());
        // Only in the namespaces the controller manages (blanks dropped, as it drops them).
        let controller = ControllerArgs {
            watch_namespaces: vec![" team-a".into(), String::new()],
            ..ControllerArgs::default()
        };
        let finalizers = controller_init(false, &controller);
        assert_eq!(finalizers[0].namespaces(), ["team-a".to_owned()]);
        assert!(finalizers[0].applies_to(kind::Kind::CLUSTER, "team-a"));
        assert!(!finalizers[0].applies_to(kind::Kind::CLUSTER, "team-b"));
    }

    #[tokio::test]
    async fn a_plan_that_does_not_parse_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = fetch_snapshot(
            "{}",
            dir.path(),
            &dir.path().join("s.db"),
            &dir.path().join("st"),
            None,
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string().starts_with("--plan is not a restore plan"),
            "{err}"
        );
    }
}
