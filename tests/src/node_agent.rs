//! A test node agent: what the scheduler, a volume provisioner and the kubelet do for member
//! Pods, without a container runtime (in the way kwok stands in for nodes). It binds unscheduled
//! Pods to its node, gives each Pod a loopback address of its own (`127.a.b.n`) and its
//! `<hostname>.<subdomain>.<namespace>.svc` name in a hosts file, provides its volumes (a
//! directory per PVC that outlives the Pod, emptyDirs, Secrets written out), runs the container's
//! etcd command as a local process (the image tag names the version under `.tools/etcd`),
//! reports phase, Pod IP, restarts and readiness (the container's HTTP readiness probe), restarts
//! exited containers, and honours deletion: SIGTERM, then the final delete with grace 0. Claims
//! are provisioned at the size they ask for; a claim asked to grow whose StorageClass allows
//! expansion gets `FileSystemResizePending` and its new capacity when a Pod mounts it next.
//!
//! Init containers run once per Pod, in order, each to completion (their exit codes and the end
//! of their output reported as `initContainerStatuses`, as `FallbackToLogsOnError` does); the
//! operator's image runs this workspace's `etcd-operator`, an etcd image `etcd`, `etcdutl` or
//! `etcdctl` of its version; environment values and Secret keys are passed. Anything else (other
//! volume kinds, other programs) is reported on the Pod as the container waiting with reason
//! `NodeAgentUnsupported`, never ignored. It polls the Pod list every 200 ms rather than watching
//! (a test needs no more).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::process::TestProcess;

/// How often the agent looks at its Pods.
const POLL: Duration = Duration::from_millis(200);
/// The longest an exited container waits before it is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long a stopping container gets after SIGTERM before SIGKILL, whatever the Pod's grace.
const MAX_STOP: Duration = Duration::from_secs(10);

/// Where the agent keeps things and what it runs.
#[derive(Debug, Clone)]
pub struct NodeAgentOptions {
    /// The node name Pods are bound to.
    pub node: String,
    /// Volumes (`volumes/<namespace>/<claim>`, `pods/<uid>/...`) and container logs.
    pub root: PathBuf,
    /// etcd binaries as `<dir>/<version>/etcd` (`.tools/etcd`).
    pub etcd_binaries: PathBuf,
    /// The hosts file the Pods' names are appended to (the one bind-mounted on /etc/hosts).
    pub hosts: PathBuf,
    /// The operator's image and the binary its containers run (the restore init containers).
    pub operator: Option<(String, PathBuf)>,
}

/// One container the agent runs.
#[derive(Debug)]
struct Running {
    namespace: String,
    name: String,
    process: Option<TestProcess>,
    restarts: i32,
    next_start: Option<Instant>,
    last_exit: Option<i32>,
    ready: bool,
    ip: String,
    started_at: String,
    reported: Option<serde_json::Value>,
    /// The init containers ran to completion (they run once per Pod).
    init_done: bool,
    /// What they reported.
    init_statuses: Vec<serde_json::Value>,
}

#[derive(Debug, Default)]
struct AgentState {
    /// By Pod uid.
    running: BTreeMap<String, Running>,
    /// Loopback address by `<namespace>/<name>`: a Pod created again keeps its address, so the
    /// hosts file (read first match first) never needs a line changed.
    addresses: BTreeMap<String, String>,
    named: BTreeSet<String>,
}

/// A running agent; stops every container it started when dropped.
#[derive(Debug)]
pub struct NodeAgent {
    state: Arc<Mutex<AgentState>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeAgent {
    /// Starts the agent against `client`'s cluster.
    pub fn start(client: Client, options: NodeAgentOptions) -> Self {
        let state = Arc::new(Mutex::new(AgentState::default()));
        let agent = Agent {
            client,
            options,
            state: state.clone(),
            // A random /16 of 127/8 per agent: tests running at once do not share addresses.
            prefix: {
                let pid = std::process::id();
                format!("127.{}.{}", 100 + pid % 150, (pid / 150) % 250)
            },
        };
        let task = tokio::spawn(async move {
            loop {
                if let Err(error) = Box::pin(agent.round()).await {
                    tracing::debug!(%error, "node agent round");
                }
                tokio::time::sleep(POLL).await;
            }
        });
        Self { state, task }
    }

    /// The address the agent gave Pod `namespace/name`, if any.
    pub fn address(&self, namespace: &str, name: &str) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.addresses.get(&format!("{namespace}/{name}")).cloned()
    }

    /// The pid of the container running for Pod `namespace/name`.
    pub fn pid(&self, namespace: &str, name: &str) -> Option<u32> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .running
            .values()
            .find(|r| r.namespace == namespace && r.name == name)
            .and_then(|r| r.process.as_ref().map(TestProcess::pid))
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.task.abort();
        // Dropping the processes kills them.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.running.clear();
    }
}

/// Why a Pod cannot run here.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    NotYet(String),
    #[error("{0}")]
    Failed(String),
}

struct Agent {
    client: Client,
    options: NodeAgentOptions,
    state: Arc<Mutex<AgentState>>,
    prefix: String,
}

fn lock(state: &Mutex<AgentState>) -> std::sync::MutexGuard<'_, AgentState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The storage a claim asks for, as written.
fn requested_storage(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

/// Whether a claim's filesystem waits for a mount to grow.
fn resize_pending(pvc: &PersistentVolumeClaim) -> bool {
    pvc.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "FileSystemResizePending" && c.status == "True")
        })
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// `registry/etcd:v3.5.16` or `...:3.5.16-0` → `3.5.16`.
fn image_version(image: &str) -> Option<String> {
    let tag = image.rsplit_once(':')?.1;
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let version = tag.split_once('-').map_or(tag, |(v, _)| v);
    (!version.is_empty() && !version.contains('/')).then(|| version.to_owned())
}

/// The container's arguments with `0.0.0.0` bound to the Pod's address and mount paths turned
/// into the host directories behind them (longest mount path first).
fn rewrite_args(args: &[String], ip: &str, mounts: &[(String, PathBuf)]) -> Vec<String> {
    let mut mounts: Vec<&(String, PathBuf)> = mounts.iter().collect();
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    args.iter()
        .map(|arg| {
            let mut arg = arg.replace("0.0.0.0", ip);
            for (path, host) in &mounts {
                if let Some(at) = arg.find(path.as_str()) {
                    let rest = &arg[at + path.len()..];
                    if rest.is_empty() || rest.starts_with('/') || rest.starts_with(',') {
                        arg = format!("{}{}{rest}", &arg[..at], host.display());
                    }
                }
            }
            arg
        })
        .collect()
}

impl Agent {
    async fn round(&self) -> Result<(), kube::Error> {
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default())
            .await?;
        let mut seen = BTreeSet::new();
        for pod in pods.items {
            let uid = pod.uid().unwrap_or_default();
            seen.insert(uid.clone());
            if let Err(error) = self.handle(&pod, &uid).await {
                tracing::debug!(pod = %pod.name_any(), %error, "node agent");
            }
        }
        if let Err(error) = self.resize_claims().await {
            tracing::debug!(%error, "node agent: resizing claims");
        }
        // Pods deleted behind the agent's back (forced): their containers stop.
        lock(&self.state).running.retain(|uid, _| seen.contains(uid));
        Ok(())
    }

    /// What the external resizer does for claims asked to grow: when their StorageClass allows
    /// expansion, the volume grows and the claim says `FileSystemResizePending` (this stand-in
    /// driver grows filesystems only on mount, offline, so the member's Pod must start again).
    /// A class without `allowVolumeExpansion` leaves the claim alone (kube-apiserver's admission
    /// would have refused the request).
    async fn resize_claims(&self) -> Result<(), kube::Error> {
        let claims = Api::<PersistentVolumeClaim>::all(self.client.clone())
            .list(&ListParams::default())
            .await?;
        let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(self.client.clone());
        for pvc in claims.items {
            let capacity = pvc
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .map(|q| q.0.clone());
            let Some(capacity) = capacity else { continue };
            if capacity == requested_storage(&pvc) || resize_pending(&pvc) {
                continue;
            }
            let class = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone());
            let expandable = match class {
                Some(class) => classes
                    .get_opt(&class)
                    .await?
                    .is_some_and(|c| c.allow_volume_expansion == Some(true)),
                None => false,
            };
            if !expandable {
                continue;
            }
            let status = json!({"status": {"conditions": [{
                "type": "FileSystemResizePending",
                "status": "True",
                "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
            }]}});
            Api::<PersistentVolumeClaim>::namespaced(
                self.client.clone(),
                &pvc.namespace().unwrap_or_default(),
            )
            .patch_status(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        }
        Ok(())
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn handle(&self, pod: &Pod, uid: &str) -> Result<(), kube::Error> {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if pod.metadata.deletion_timestamp.is_some() {
            if node.as_deref().is_some_and(|n| n != self.options.node) {
                return Ok(());
            }
            let running = lock(&self.state).running.remove(uid);
            if let Some(mut running) = running
                && let Some(process) = running.process.as_mut()
            {
                stop(process).await;
            }
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_owned()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            self.pods(&namespace).delete(&name, &params).await?;
            return Ok(());
        }
        match node {
            None => {
                let binding = json!({
                    "apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "namespace": namespace},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.options.node},
                });
                let _: serde_json::Value = self
                    .pods(&namespace)
                    .create_subresource("binding", &name, &PostParams::default(), &binding)
                    .await?;
                Ok(())
            }
            Some(n) if n != self.options.node => Ok(()),
            Some(_) => self.run(pod, uid, &namespace, &name).await,
        }
    }

    async fn run(&self, pod: &Pod, uid: &str, namespace: &str, name: &str) -> Result<(), kube::Error> {
        let known = lock(&self.state).running.contains_key(uid);
        if !known {
            let ip = self.address(namespace, name);
            lock(&self.state).running.insert(
                uid.to_owned(),
                Running {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    process: None,
                    restarts: 0,
                    next_start: Some(Instant::now()),
                    last_exit: None,
                    ready: false,
                    ip,
                    started_at: now(),
                    reported: None,
                    init_done: false,
                    init_statuses: Vec::new(),
                },
            );
        }
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .cloned()
            .unwrap_or_default();
        // Exited? Then a restart after a back-off (restartPolicy Always, as member Pods have).
        let due = {
            let mut state = lock(&self.state);
            let Some(r) = state.running.get_mut(uid) else {
                return Ok(());
            };
            if let Some(process) = r.process.as_mut()
                && let Some(status) = process.exited()
            {
                r.last_exit = Some(status.code().unwrap_or(-1));
                r.process = None;
                r.ready = false;
                r.restarts += 1;
                let backoff = Duration::from_secs(1u64 << r.restarts.clamp(0, 4) as u32);
                r.next_start = Some(Instant::now() + backoff.min(MAX_BACKOFF));
            }
            r.process.is_none() && r.next_start.is_some_and(|at| Instant::now() >= at)
        };
        let mut waiting: Option<(String, String)> = None;
        if due {
            match self.start(pod, uid, namespace, &container).await {
                Ok(process) => {
                    let mut state = lock(&self.state);
                    if let Some(r) = state.running.get_mut(uid) {
                        r.process = Some(process);
                        r.next_start = None;
                        r.started_at = now();
                    }
                }
                Err(StartError::NotYet(why)) => waiting = Some(("ContainerCreating".into(), why)),
                Err(StartError::Unsupported(why)) => waiting = Some(("NodeAgentUnsupported".into(), why)),
                Err(StartError::Failed(why)) => {
                    waiting = Some(("RunContainerError".into(), why));
                    if let Some(r) = lock(&self.state).running.get_mut(uid) {
                        r.next_start = Some(Instant::now() + MAX_BACKOFF);
                    }
                }
            }
        }
        let ready = match self.probe_target(uid, &container) {
            Some(url) => probe(&url).await,
            None => false,
        };
        self.report(uid, namespace, name, &container, ready, waiting)
            .await
    }

    /// The address of Pod `namespace/name`, and its names in the hosts file.
    fn address(&self, namespace: &str, name: &str) -> String {
        let key = format!("{namespace}/{name}");
        let mut state = lock(&self.state);
        if let Some(ip) = state.addresses.get(&key) {
            return ip.clone();
        }
        let n = state.addresses.len() + 1;
        let ip = format!("{}.{}", self.prefix, n.min(254));
        state.addresses.insert(key, ip.clone());
        ip
    }

    fn publish_names(&self, pod: &Pod, namespace: &str, ip: &str) -> Result<(), StartError> {
        let spec = pod.spec.as_ref();
        let (Some(hostname), Some(subdomain)) = (
            spec.and_then(|s| s.hostname.clone()),
            spec.and_then(|s| s.subdomain.clone()),
        ) else {
            return Ok(());
        };
        let short = format!("{hostname}.{subdomain}.{namespace}.svc");
        let mut state = lock(&self.state);
        if !state.named.insert(short.clone()) {
            return Ok(());
        }
        let line = format!("{ip} {short} {short}.cluster.local\n");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.options.hosts)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| StartError::Failed(format!("add {short} to {}: {e}", self.options.hosts.display())))
    }

    /// Provides the Pod's volumes: `(volume name, host directory)`.
    async fn volumes(
        &self,
        pod: &Pod,
        uid: &str,
        namespace: &str,
    ) -> Result<Vec<(String, PathBuf)>, StartError> {
        let mut out = Vec::new();
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        for volume in volumes {
            let dir = if let Some(claim) = &volume.persistent_volume_claim {
                let dir = self
                    .options
                    .root
                    .join("volumes")
                    .join(namespace)
                    .join(&claim.claim_name);
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
                let found = claims
                    .get_opt(&claim.claim_name)
                    .await
                    .map_err(|e| StartError::NotYet(format!("read PVC {}: {e}", claim.claim_name)))?;
                let Some(pvc) = found else {
                    return Err(StartError::NotYet(format!(
                        "persistentvolumeclaim \"{}\" not found",
                        claim.claim_name
                    )));
                };
                let requested = requested_storage(&pvc);
                if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
                    // Provisioned at the size asked for.
                    let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": requested}}});
                    claims
                        .patch_status(&claim.claim_name, &PatchParams::default(), &Patch::Merge(&status))
                        .await
                        .map_err(|e| StartError::NotYet(format!("bind PVC {}: {e}", claim.claim_name)))?;
                } else if resize_pending(&pvc) {
                    // The kubelet finishes an expansion when it mounts the volume: the filesystem
                    // grows, the claim reports the new capacity.
                    let status = json!({"status": {"capacity": {"storage": requested}, "conditions": []}});
                    claims
                        .patch_status(&claim.claim_name, &PatchParams::default(), &Patch::Merge(&status))
                        .await
                        .map_err(|e| StartError::NotYet(format!("resize PVC {}: {e}", claim.claim_name)))?;
                }
                dir
            } else if volume.empty_dir.is_some() {
                self.options
                    .root
                    .join("pods")
                    .join(uid)
                    .join("volumes")
                    .join(&volume.name)
            } else if let Some(source) = &volume.secret {
                let secret_name = source.secret_name.clone().unwrap_or_default();
                let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
                let secret = secrets
                    .get_opt(&secret_name)
                    .await
                    .map_err(|e| StartError::NotYet(format!("read Secret {secret_name}: {e}")))?
                    .ok_or_else(|| StartError::NotYet(format!("secret \"{secret_name}\" not found")))?;
                let dir = self
                    .options
                    .root
                    .join("pods")
                    .join(uid)
                    .join("volumes")
                    .join(&volume.name);
                std::fs::create_dir_all(&dir).map_err(|e| StartError::Failed(e.to_string()))?;
                write_secret(&dir, &secret_name, secret.data.unwrap_or_default(), source)?;
                dir
            } else {
                return Err(StartError::Unsupported(format!(
                    "volume {} is of a kind the node agent does not provide",
                    volume.name
                )));
            };
            std::fs::create_dir_all(&dir)
                .map_err(|e| StartError::Failed(format!("create {}: {e}", dir.display())))?;
            out.push((volume.name, dir));
        }
        Ok(out)
    }

    async fn start(
        &self,
        pod: &Pod,
        uid: &str,
        namespace: &str,
        container: &Container,
    ) -> Result<TestProcess, StartError> {
        let spec = pod.spec.as_ref();
        if spec.is_some_and(|s| s.containers.len() != 1) {
            return Err(StartError::Unsupported(
                "the node agent runs Pods of one container".into(),
            ));
        }
        let ip = lock(&self.state)
            .running
            .get(uid)
            .map(|r| r.ip.clone())
            .unwrap_or_default();
        self.publish_names(pod, namespace, &ip)?;
        let volumes = self.volumes(pod, uid, namespace).await?;
        let init_done = lock(&self.state).running.get(uid).is_some_and(|r| r.init_done);
        if !init_done {
            // Init containers run once per Pod, in order, each to completion.
            let inits = spec.and_then(|s| s.init_containers.clone()).unwrap_or_default();
            let mut statuses = Vec::new();
            for init in &inits {
                let mut process = self
                    .spawn(pod, uid, namespace, init, &ip, &volumes, "init")
                    .await?;
                let code = loop {
                    if let Some(status) = process.exited() {
                        break status.code().unwrap_or(-1);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                // FallbackToLogsOnError: the end of its output is the termination message.
                let message = process.log_tail(1024);
                let (reason, ok) = if code == 0 {
                    ("Completed", true)
                } else {
                    ("Error", false)
                };
                statuses.push(json!({
                    "name": init.name, "image": init.image, "imageID": "", "ready": ok,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": code, "reason": reason, "message": message.trim()}},
                }));
                if !ok {
                    if let Some(r) = lock(&self.state).running.get_mut(uid) {
                        r.init_statuses = statuses;
                    }
                    return Err(StartError::Failed(format!(
                        "init container {} exited with {code}",
                        init.name
                    )));
                }
            }
            if let Some(r) = lock(&self.state).running.get_mut(uid) {
                r.init_statuses = statuses;
                r.init_done = true;
            }
        }
        self.spawn(pod, uid, namespace, container, &ip, &volumes, "run")
            .await
    }

    /// The program a container runs: the operator's image runs the `etcd-operator` binary of
    /// this workspace; an etcd image runs `etcd`, `etcdutl` or `etcdctl` of its version.
    fn program(&self, container: &Container) -> Result<(PathBuf, Vec<String>), StartError> {
        let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
        argv.extend(container.args.clone().unwrap_or_default());
        let image = container.image.clone().unwrap_or_default();
        if let Some((operator_image, binary)) = &self.options.operator
            && *operator_image == image
        {
            if argv.first().map(String::as_str) == Some("etcd-operator") {
                argv.remove(0);
            }
            return Ok((binary.clone(), argv));
        }
        let tool = argv.first().cloned().unwrap_or_default();
        if !matches!(tool.as_str(), "etcd" | "etcdutl" | "etcdctl") {
            return Err(StartError::Unsupported(format!(
                "the node agent runs etcd, etcdutl, etcdctl and the operator's image, not {tool:?} of {image:?}"
            )));
        }
        let version = image_version(&image)
            .ok_or_else(|| StartError::Unsupported(format!("image {image:?} has no version tag")))?;
        let binary = self.options.etcd_binaries.join(&version).join(&tool);
        if !binary.is_file() {
            return Err(StartError::Failed(format!(
                "no {tool} {version} at {} (run `make tools`)",
                binary.display()
            )));
        }
        argv.remove(0);
        Ok((binary, argv))
    }

    /// Starts one container of the Pod: its program, its arguments on the Pod's address and the
    /// host directories of its mounts, its environment (values and Secret keys).
    #[allow(clippy::too_many_arguments)]
    async fn spawn(
        &self,
        pod: &Pod,
        uid: &str,
        namespace: &str,
        container: &Container,
        ip: &str,
        volumes: &[(String, PathBuf)],
        what: &str,
    ) -> Result<TestProcess, StartError> {
        let mounts: Vec<(String, PathBuf)> = container
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| {
                let (_, dir) = volumes.iter().find(|(v, _)| *v == m.name)?;
                let dir = match &m.sub_path {
                    Some(sub) if !sub.is_empty() => dir.join(sub),
                    _ => dir.clone(),
                };
                Some((m.mount_path.clone(), dir))
            })
            .collect();
        let (binary, argv) = self.program(container)?;
        let args = rewrite_args(&argv, ip, &mounts);
        let logs = self.options.root.join("pods").join(uid);
        std::fs::create_dir_all(&logs).map_err(|e| StartError::Failed(e.to_string()))?;
        let restarts = lock(&self.state).running.get(uid).map_or(0, |r| r.restarts);
        let mut cmd = Command::new(&binary);
        cmd.args(&args);
        for env in container.env.iter().flatten() {
            if let Some(value) = &env.value {
                cmd.env(&env.name, value);
            } else if let Some(key) = env.value_from.as_ref().and_then(|f| f.secret_key_ref.as_ref()) {
                let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
                let secret = secrets
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| StartError::NotYet(format!("read Secret {}: {e}", key.name)))?
                    .ok_or_else(|| StartError::NotYet(format!("secret \"{}\" not found", key.name)))?;
                let value = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&key.key))
                    .ok_or_else(|| {
                        StartError::NotYet(format!("secret \"{}\" has no key {}", key.name, key.key))
                    })?;
                cmd.env(&env.name, String::from_utf8_lossy(&value.0).as_ref());
            }
        }
        TestProcess::spawn(
            format!("{namespace}/{}/{}", pod.name_any(), container.name),
            cmd,
            &logs.join(format!("{}-{what}-{restarts}.log", container.name)),
        )
        .map_err(|e| StartError::Failed(e.to_string()))
    }

    /// The readiness probe's URL on the Pod's address, once a container runs.
    fn probe_target(&self, uid: &str, container: &Container) -> Option<String> {
        let state = lock(&self.state);
        let running = state.running.get(uid)?;
        running.process.as_ref()?;
        let get = container.readiness_probe.as_ref()?.http_get.as_ref()?;
        let port = match &get.port {
            IntOrString::Int(p) => *p,
            IntOrString::String(named) => {
                container
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(named.as_str()))?
                    .container_port
            }
        };
        let scheme = get.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
        Some(format!(
            "{scheme}://{}:{port}{}",
            running.ip,
            get.path.as_deref().unwrap_or("/")
        ))
    }

    async fn report(
        &self,
        uid: &str,
        namespace: &str,
        name: &str,
        container: &Container,
        ready: bool,
        waiting: Option<(String, String)>,
    ) -> Result<(), kube::Error> {
        let status = {
            let mut state = lock(&self.state);
            let Some(r) = state.running.get_mut(uid) else {
                return Ok(());
            };
            r.ready = ready && r.process.is_some();
            let state_json = match (&r.process, &waiting) {
                (Some(_), _) => json!({"running": {"startedAt": r.started_at}}),
                (None, Some((reason, message))) => json!({"waiting": {"reason": reason, "message": message}}),
                (None, None) => json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            };
            let last = r
                .last_exit
                .map(|code| json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }}}))
                .unwrap_or_else(|| json!({}));
            let truth = if r.ready { "True" } else { "False" };
            let init_statuses = r.init_statuses.clone();
            let phase = if r.init_done || r.process.is_some() {
                "Running"
            } else {
                "Pending"
            };
            json!({
                "phase": phase,
                "initContainerStatuses": init_statuses,
                "podIP": r.ip,
                "podIPs": [{"ip": r.ip}],
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": truth},
                    {"type": "Ready", "status": truth},
                ],
                "containerStatuses": [{
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": r.ready,
                    "started": r.process.is_some(),
                    "restartCount": r.restarts,
                    "state": state_json,
                    "lastState": last,
                }],
            })
        };
        let changed = lock(&self.state)
            .running
            .get(uid)
            .map(|r| r.reported.as_ref() != Some(&status));
        if changed != Some(true) {
            return Ok(());
        }
        let mut full = status.clone();
        if let Some(since) = full.get_mut("conditions").and_then(|c| c.as_array_mut()) {
            for condition in since {
                condition["lastTransitionTime"] = json!(now());
            }
        }
        self.pods(namespace)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": full})),
            )
            .await?;
        if let Some(r) = lock(&self.state).running.get_mut(uid) {
            r.reported = Some(status);
        }
        Ok(())
    }
}

/// A Secret volume's files: the keys `items` maps (to their paths), else every key; with the
/// item's or the volume's mode (0644 when neither says, as the kubelet does).
fn write_secret(
    dir: &Path,
    secret_name: &str,
    data: BTreeMap<String, k8s_openapi::ByteString>,
    source: &k8s_openapi::api::core::v1::SecretVolumeSource,
) -> Result<(), StartError> {
    use std::os::unix::fs::PermissionsExt as _;
    let files: Vec<(String, String, Option<i32>)> = match &source.items {
        Some(items) => items
            .iter()
            .map(|i| (i.key.clone(), i.path.clone(), i.mode))
            .collect(),
        None => data.keys().map(|k| (k.clone(), k.clone(), None)).collect(),
    };
    for (key, path, mode) in files {
        let value = data
            .get(&key)
            .ok_or_else(|| StartError::NotYet(format!("secret \"{secret_name}\" has no key {key:?}")))?;
        let file = dir.join(&path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| StartError::Failed(e.to_string()))?;
        }
        std::fs::write(&file, &value.0)
            .map_err(|e| StartError::Failed(format!("write Secret key {key}: {e}")))?;
        let mode = mode.or(source.default_mode).unwrap_or(0o644);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode as u32 & 0o777))
            .map_err(|e| StartError::Failed(format!("set the mode of {}: {e}", file.display())))?;
    }
    Ok(())
}

/// SIGTERM, then SIGKILL after [`MAX_STOP`].
async fn stop(process: &mut TestProcess) {
    let Ok(pid) = i32::try_from(process.pid()) else {
        return;
    };
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + MAX_STOP;
    while Instant::now() < deadline {
        if process.exited().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process.kill();
}

async fn probe(url: &str) -> bool {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(1))
        .build();
    match client {
        Ok(client) => client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success()),
        Err(_) => false,
    }
}

/// A hosts file for a private mount namespace: this machine's own entries, to which the agent
/// appends the Pods' names.
pub fn seed_hosts(path: &Path) -> std::io::Result<()> {
    let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    if !text.ends_with('\n') && !text.is_empty() {
        text.push('\n');
    }
    if !text.contains("localhost") {
        text.push_str("127.0.0.1 localhost\n");
    }
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags_name_the_etcd_version() {
        assert_eq!(
            image_version("registry.k8s.io/etcd:v3.5.16").as_deref(),
            Some("3.5.16")
        );
        assert_eq!(
            image_version("registry.k8s.io/etcd:3.5.21-0").as_deref(),
            Some("3.5.21")
        );
        assert_eq!(image_version("localhost:5000/etcd").as_deref(), None);
        assert_eq!(image_version("etcd"), None);
    }

    #[test]
    fn arguments_listen_on_the_pod_address_and_use_the_host_directories() {
        let mounts = vec![
            ("/var/lib/etcd".to_owned(), PathBuf::from("/tmp/v/data")),
            ("/etc/etcd/tls/peer".to_owned(), PathBuf::from("/tmp/v/peer")),
        ];
        let args = vec![
            "--data-dir=/var/lib/etcd/data".to_owned(),
            "--listen-peer-urls=http://0.0.0.0:2380".to_owned(),
            "--peer-cert-file=/etc/etcd/tls/peer/tls.crt".to_owned(),
            "--name=/var/lib/etcdx".to_owned(),
        ];
        assert_eq!(
            rewrite_args(&args, "127.1.2.3", &mounts),
            vec![
                "--data-dir=/tmp/v/data/data",
                "--listen-peer-urls=http://127.1.2.3:2380",
                "--peer-cert-file=/tmp/v/peer/tls.crt",
                "--name=/var/lib/etcdx",
            ]
        );
    }
}

/// The operator's image as the member Pods name it; the node agent runs this workspace's binary
/// for it.
pub const OPERATOR_IMAGE: &str = "ghcr.io/etcd-operator/etcd-operator:e2e";

/// The kubernetes runtime without kube-apiserver: the in-memory Kubernetes API, this node agent
/// on it, and `etcd-operator local --member-kubeconfig` running its members there (the test runs
/// in a private mount namespace, see [`crate::private_hosts`]).
#[derive(Debug)]
pub struct KubeRuntime {
    /// The in-memory Kubernetes API.
    pub kube_api: crate::fake_kube::FakeKube,
    /// The node agent running the Pods.
    pub agent: NodeAgent,
    /// The operator.
    pub op: crate::LocalOperator,
    /// The agent's volumes and the members' kubeconfig (removed when dropped).
    pub dir: tempfile::TempDir,
}

/// The kubernetes runtime could not be started.
#[derive(Debug, thiserror::Error)]
pub enum KubeRuntimeError {
    /// The agent's directory could not be made.
    #[error("create the node agent's directory")]
    Dir(#[from] std::io::Error),
    /// The in-memory API did not start or write its kubeconfig.
    #[error("start the in-memory Kubernetes API")]
    Api(#[from] crate::fake_kube::FakeKubeError),
    /// No client of the in-memory API.
    #[error("connect to the in-memory Kubernetes API")]
    Client(#[from] kube::Error),
    /// The operator did not build or start.
    #[error("start the operator")]
    Operator(#[from] crate::operator::OperatorError),
}

impl KubeRuntime {
    /// Starts the API, the agent on `hosts` and the operator.
    pub async fn start(hosts: PathBuf) -> Result<Self, KubeRuntimeError> {
        Self::start_with(hosts, Vec::new()).await
    }

    /// With extra environment for the operator (S3 keys, its snapshot directory); the node agent
    /// runs the operator's image as this workspace's binary.
    pub async fn start_with(hosts: PathBuf, env: Vec<(String, String)>) -> Result<Self, KubeRuntimeError> {
        let dir = tempfile::Builder::new()
            .prefix("etcd-operator-node-agent-")
            .tempdir()?;
        let kube_api = crate::fake_kube::FakeKube::start().await?;
        let kubeconfig = kube_api.write_kubeconfig(&dir.path().join("members.kubeconfig"))?;
        let agent = NodeAgent::start(
            kube_api.client()?,
            NodeAgentOptions {
                node: "node-1".into(),
                root: dir.path().join("node"),
                etcd_binaries: crate::tools::tools_dir().join("etcd"),
                hosts,
                operator: Some((OPERATOR_IMAGE.to_owned(), crate::operator::operator_binary()?)),
            },
        );
        let mut env = env;
        env.push(("ETCD_OPERATOR_IMAGE".to_owned(), OPERATOR_IMAGE.to_owned()));
        let op = crate::LocalOperator::start_with(crate::operator::OperatorOptions {
            env,
            args: vec!["--member-kubeconfig".into(), kubeconfig.display().to_string()],
        })
        .await?;
        Ok(Self {
            kube_api,
            agent,
            op,
            dir,
        })
    }
}
