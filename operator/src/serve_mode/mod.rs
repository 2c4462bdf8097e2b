//! `etcd-operator serve`: the API server and the controller inside a Kubernetes cluster, behind
//! the kube-apiserver aggregator, the controllers running only while this replica holds the
//! leader Lease ([`leader`]), or, with `--shards N`, for the clusters of the shards whose Leases
//! it holds ([`shards`]).

pub mod leader;
pub mod shards;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use etcd_operator_apiserver::cluster::authn::{DelegatedAuthenticator, TokenReviewer};
use etcd_operator_apiserver::cluster::authz::SubjectAccessReviewAuthorizer;
use etcd_operator_apiserver::cluster::config;
use etcd_operator_apiserver::cluster::loopback::{Loopback, LoopbackError};
use etcd_operator_apiserver::cluster::tls::{ServingTls, follow_client_cas, watch_serving_files};
use etcd_operator_apiserver::http::{self, AppState, Stores, openapi};
use etcd_operator_apiserver::serve;
use etcd_operator_apiserver::storage::{Storage, StorageError, StorageOptions};
use etcd_operator_controller::metrics::ControllerMetrics;
use etcd_operator_controller::shard::ShardOwnership;
use prometheus_client::registry::Registry;

/// How often the authentication ConfigMap is re-read.
pub const CONFIG_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// How often the serving certificate files are re-read.
pub const CERT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);
/// How often the backing etcd is compacted.
pub const COMPACTION_INTERVAL: Duration = Duration::from_secs(300);

/// Flags of `etcd-operator serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Serving certificate (PEM chain); re-read when it changes.
    #[arg(long)]
    pub tls_cert_file: PathBuf,
    /// Serving private key (PEM); re-read when it changes.
    #[arg(long)]
    pub tls_private_key_file: PathBuf,
    /// Backing etcd endpoints, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub etcd_servers: Vec<String>,
    /// CA bundle to verify the backing etcd's serving certificates.
    #[arg(long)]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate for the backing etcd.
    #[arg(long, requires = "etcd_keyfile")]
    pub etcd_certfile: Option<PathBuf>,
    /// Client key for the backing etcd.
    #[arg(long, requires = "etcd_certfile")]
    pub etcd_keyfile: Option<PathBuf>,
    /// Kubeconfig for kube-apiserver (default: in-cluster configuration).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the `extension-apiserver-authentication` ConfigMap.
    #[arg(long, default_value = config::DEFAULT_NAMESPACE)]
    pub authentication_configmap_namespace: String,
    /// Leader election for the controllers (needed with more than one replica).
    #[command(flatten)]
    pub leader_election: leader::LeaderElectionArgs,
    /// The API server's overload limits (on the public listener; the controllers' in-process
    /// requests are not limited, as kube-apiserver exempts its loopback client).
    #[command(flatten)]
    pub overload: crate::flags::OverloadArgs,
    /// The controller's thresholds.
    #[command(flatten)]
    pub controller: crate::flags::ControllerArgs,
}

/// Running serve mode failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeModeError {
    /// A file could not be read.
    #[error("read {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kube-apiserver client could not be configured.
    #[error("configure the kube-apiserver client: {0}")]
    KubeClient(String),
    /// The backing etcd could not be reached.
    #[error("connect to the backing etcd")]
    Etcd(#[source] etcd_client::Error),
    /// Storage failed to start.
    #[error("start storage")]
    Storage(#[from] StorageError),
    /// The serving TLS configuration is unusable.
    #[error("build serving TLS configuration")]
    Tls(#[from] serve::TlsError),
    /// The loopback path could not be set up.
    #[error(transparent)]
    Loopback(#[from] LoopbackError),
    /// OpenAPI generation failed.
    #[error(transparent)]
    OpenApi(#[from] openapi::OpenApiGenerateError),
    /// Leader election is misconfigured.
    #[error(transparent)]
    LeaderElection(#[from] leader::LeaderElectionError),
    /// Binding a listener failed.
    #[error("listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serve HTTPS")]
    Serve(#[from] serve::ServeError),
}

async fn read(path: &PathBuf) -> Result<Vec<u8>, ServeModeError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| ServeModeError::ReadFile {
            path: path.clone(),
            source,
        })
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, ServeModeError> {
    let err = |e: &dyn std::fmt::Display| ServeModeError::KubeClient(e.to_string());
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| err(&e))?
        }
        None => kube::Config::infer().await.map_err(|e| err(&e))?,
    };
    kube::Client::try_from(config).map_err(|e| err(&e))
}

async fn etcd_client(args: &ServeArgs) -> Result<etcd_client::Client, ServeModeError> {
    let mut tls = None;
    if let Some(ca) = &args.etcd_cafile {
        let pem = read(ca).await?;
        tls = Some(etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(pem)));
    }
    if let (Some(cert), Some(key)) = (&args.etcd_certfile, &args.etcd_keyfile) {
        let identity = etcd_client::Identity::from_pem(read(cert).await?, read(key).await?);
        tls = Some(tls.unwrap_or_default().identity(identity));
    }
    let mut options = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(10));
    if let Some(tls) = tls {
        options = options.with_tls(tls);
    }
    etcd_client::Client::connect(&args.etcd_servers, Some(options))
        .await
        .map_err(ServeModeError::Etcd)
}

/// Starts the member and backup controllers: Pods, PVCs, Services, Events and Secrets through
/// `kube` (the pod's ServiceAccount), EtcdClusters and EtcdBackups through `controller_client`
/// (the loopback identity). They run only while this replica holds the leader Lease (always,
/// without `--leader-elect`), are stopped when it is lost and started anew when it is regained.
/// They record in `metrics`; the per-cluster series go when leadership does (only the leader's
/// view is current). With `--shards N` (N > 1) they run from the start and reconcile the
/// clusters of the shards the [`shards::ShardManager`] holds; a cluster's series go when its
/// shard does.
pub fn spawn_controllers(
    kube: kube::Client,
    controller_client: kube::Client,
    leader_election: leader::LeaderElectionArgs,
    tasks: CancellationToken,
    metrics: ControllerMetrics,
    settings: &crate::flags::ControllerArgs,
) -> tokio::task::JoinHandle<Result<(), leader::LeaderElectionError>> {
    let thresholds = settings.thresholds();
    let namespaces = settings.namespaces();
    let runtime = etcd_operator_controller::runtime::kubernetes::KubernetesRuntime::new(kube.clone())
        .with_namespaces(namespaces.clone())
        .with_snapshot_dir(settings.snapshot_dir.clone());
    let credentials = etcd_operator_controller::backup::Credentials::Kubernetes(kube.clone());
    let controller_metrics = metrics.clone();
    let controllers = move |stop: CancellationToken, shards: ShardOwnership| {
        let metrics = controller_metrics.clone();
        let ctx = etcd_operator_controller::reconcile::Context::new(
            controller_client.clone(),
            runtime.clone(),
            thresholds.clone(),
        )
        .with_backup_credentials(credentials.clone())
        .with_metrics(metrics.clone())
        .with_shards(shards.clone())
        .with_namespaces(namespaces.clone());
        let backup_ctx = etcd_operator_controller::backup::BackupContext::new(
            controller_client.clone(),
            credentials.clone(),
        )
        .with_metrics(metrics.clone())
        .with_shards(shards);
        // One watch and store of the EtcdClusters for both controllers.
        let clusters =
            etcd_operator_controller::cluster_watch::shared(kube::Api::all(controller_client.clone()));
        async move {
            let (stop_members, stop_watch) = (stop.clone(), stop.clone());
            let watch = async move {
                tokio::select! {
                    () = clusters.watch => {}
                    () = stop_watch.cancelled() => {}
                }
            };
            tokio::join!(
                watch,
                etcd_operator_controller::reconcile::run_on(ctx, clusters.members, async move {
                    stop_members.cancelled().await
                }),
                etcd_operator_controller::backup::run_on(backup_ctx, Some(clusters.backups), async move {
                    stop.cancelled().await
                }),
            );
            metrics.forget_all_clusters();
        }
    };
    let shard_count = match leader_election.shard_count() {
        Ok(count) => count,
        Err(error) => return tokio::spawn(async move { Err(error) }),
    };
    if shard_count.get() == 1 {
        return tokio::spawn(leader::run_while_leader(
            kube,
            leader_election,
            tasks,
            move |stop: CancellationToken| controllers(stop, ShardOwnership::all()),
        ));
    }
    tokio::spawn(async move {
        let timing = leader_election.timing()?;
        let ownership = ShardOwnership::new(shard_count);
        let manager = shards::ShardManager::new(
            kube,
            &leader_election.leader_elect_lease_namespace,
            &leader_election.leader_elect_lease_name,
            &leader_election.identity(),
            timing,
            ownership.clone(),
        )
        .with_metrics(metrics);
        let stop = tasks.child_token();
        tokio::join!(manager.run(tasks), controllers(stop, ownership));
        Ok(())
    })
}

/// Runs serve mode until SIGINT or SIGTERM.
pub async fn run(args: ServeArgs) -> Result<(), ServeModeError> {
    args.leader_election.timing()?;
    args.leader_election.shard_count()?;
    serve::install_crypto_provider();
    let kube = kube_client(args.kubeconfig.as_ref()).await?;
    let etcd = etcd_client(&args).await?;
    let stores = Stores::open(|prefix| Storage::new(etcd.clone(), prefix, StorageOptions::default())).await?;
    // Compaction is of the whole backing etcd: one compactor, on any resource's storage.
    let compactor = stores
        .all()
        .next()
        .map(|storage| storage.spawn_compactor(COMPACTION_INTERVAL));

    let (config_tx, config_rx) = config::channel();
    let tasks = CancellationToken::new();
    let mut background = tokio::task::JoinSet::new();
    background.spawn(config::keep_loaded(
        kube.clone(),
        args.authentication_configmap_namespace.clone(),
        CONFIG_RELOAD_INTERVAL,
        config_tx,
    ));

    let serving = Arc::new(ServingTls::new(
        read(&args.tls_cert_file).await?,
        read(&args.tls_private_key_file).await?,
        Vec::new(),
    )?);
    background.spawn(watch_serving_files(
        serving.clone(),
        args.tls_cert_file.clone(),
        args.tls_private_key_file.clone(),
        CERT_RELOAD_INTERVAL,
    ));
    background.spawn(follow_client_cas(serving.clone(), config_rx.clone()));

    // One registry for the process: the API server's and the controllers' series, at /metrics.
    let mut registry = Registry::default();
    let api_metrics = http::metrics::ApiMetrics::register(&mut registry);
    let controller_metrics = ControllerMetrics::register(&mut registry);
    #[cfg(not(feature = "system-allocator"))]
    crate::allocator::JemallocStats::register(&mut registry);

    let loopback = Loopback::generate()?;
    let authenticator = DelegatedAuthenticator::new(
        config_rx,
        Some(loopback.trust()),
        Some(TokenReviewer::new(kube.clone())),
    );
    let state = AppState {
        stores,
        authenticator: Arc::new(authenticator),
        authorizer: Arc::new(SubjectAccessReviewAuthorizer::new(kube.clone())),
        openapi: Arc::new(openapi::Documents::generate()?),
        snapshots: Some(Arc::new(crate::snapshots::MemberSnapshots::default())),
        namespaces: Some(Arc::new(
            etcd_operator_apiserver::cluster::namespaces::NamespaceLifecycle::new(kube.clone()),
        )),
        metrics: Some(Arc::new(registry)),
        // The controllers of this deployment (this replica's or another's, by leader election
        // or shards) manage the clusters of their namespaces: those get the cleanup finalizer
        // and the controller's first status at create, which saves the controller two writes
        // per new cluster.
        controller_init: crate::controller_init::for_controller(&args.controller),
    };
    // The controller's own requests (in process, `serve::InProcess`) are counted too, as
    // kube-apiserver counts its loopback client's, and not limited, as it exempts that client.
    let router = http::router(state);
    let app = http::metrics::instrument(router.clone(), api_metrics.clone());

    let public = TcpListener::bind(args.listen)
        .await
        .map_err(|source| ServeModeError::Listen {
            addr: args.listen,
            source,
        })?;

    // The controller: EtcdClusters in process as its own identity; Pods, PVCs, Services and
    // Events through kube-apiserver with the pod's ServiceAccount.
    let controller_client = loopback.client(app)?;
    let controllers = spawn_controllers(
        kube.clone(),
        controller_client,
        args.leader_election.clone(),
        tasks.clone(),
        controller_metrics,
        &args.controller,
    );

    tracing::info!(listen = %args.listen, "etcd-operator serve is starting");
    // Outermost on the public port: the overload refusals (429, 504) are counted.
    let public_app = http::metrics::instrument(
        http::overload::limit(router, args.overload.options()),
        api_metrics,
    );
    let served = serve::serve(public, serving.reloadable(), public_app, serve::shutdown_signal()).await;

    tasks.cancel();
    match tokio::time::timeout(Duration::from_secs(10), controllers).await {
        Ok(Ok(Err(error))) => {
            tracing::warn!(error = %etcd_operator_api::report::Chain(&error), "leader election")
        }
        Ok(_) => {}
        Err(_) => tracing::warn!("the controllers did not stop within 10 s"),
    }
    background.abort_all();
    if let Some(compactor) = compactor {
        compactor.abort();
    }
    served?;
    Ok(())
}
