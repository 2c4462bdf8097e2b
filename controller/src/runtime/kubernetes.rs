//! The kubernetes runtime: every member is a Pod named after it with its own PVC (`<member>-data`),
//! or a tmpfs emptyDir for `medium: Memory`; a headless peer Service, a client Service and a
//! PodDisruptionBudget per cluster. Objects are built by [`crate::resources`].
//!
//! State lives in the cluster, so a restarted operator re-adopts its members:
//! - the member label on Pods and PVCs names the members;
//! - a member's [`MemberConfig`] is stored as the `etcd.operator.dev/member-config` annotation on
//!   its PVC when it is started (before its Pod exists) and on its Pod, so a deleted Pod is
//!   recreated identically on the same PVC.
//!
//! `medium: Memory` members have no PVC, so nothing in the cluster records them before their Pod
//! exists. Their reservation (and configuration, until the Pod carries it) is kept in this
//! runtime's memory: after an operator restart a reserved-but-unstarted memory member is simply
//! unknown (the planner sees it as absent and plans again), and a running one is re-adopted from
//! its Pod. A memory member whose Pod is gone has lost its data: it is reported `Gone` while the
//! runtime remembers it, and [`Runtime::start`] refuses to restart it empty (it must be replaced).
//!
//! Liveness of a member:
//! - Pod present and not being deleted: `Running` (also while `Pending` or `Unknown`: etcd's own
//!   health decides whether it works), `Gone` when its phase is `Failed` or `Succeeded`, or when
//!   its PVC is being deleted;
//! - Pod being deleted, or missing while a configuration is recorded: `Gone`;
//! - no Pod and no configuration: `Reserved`.
//!
//! A member whose every object is being deleted (after [`Runtime::remove`]) is not reported.
//! A member removed without keeping its data has its PVC set aside rather than deleted: the
//! member label gives way to [`resources::REMOVED_MEMBER_LABEL`] (so no member adopts it), the
//! cluster's label and owner reference stay (so it goes with the cluster), and only the newest
//! [`RETAINED_REMOVED_LIMIT`] such claims of a cluster are kept.
//!
//! A member started from a snapshot (`MemberConfig::restore`) gets restore init containers (see
//! [`crate::resources::build_pod`]) that run the operator's own image, named by
//! [`resources::OPERATOR_IMAGE_ENV`]. Without it, or with a snapshot in a volume destination
//! (which member Pods cannot mount), `start` fails before any API call; a restore init container
//! that exits with an error (a checksum mismatch) is reported by the next `start`.
//!
//! Member TLS (`spec.tls`, see [`tls`]): before a member's Pod is created its certificates are
//! made sure of (`auto`: issued from the cluster's CA Secrets into `<member>-tls`; `secretRef`:
//! the Secret checked; `certManager`: Certificates applied, their Secrets awaited), and the Pod
//! mounts them. Pods and PVCs of TLS members carry [`resources::tls::TLS_ANNOTATION`], so the
//! members are reported with `https://` URLs, and members with `auto` certificates report them
//! ([`RuntimeMember::certificates`]) from their Secrets.

mod cache;
mod tls;

pub use cache::{ChildCache, OWN_WRITES_WINDOW};

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use etcd_operator_api::naming::{self, MEMBER_LABEL};
use etcd_operator_api::v1alpha2::StorageMedium;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{RETAINED_REMOVED_LIMIT, Runtime, RuntimeError, ValidatedCluster};
use crate::model::{ClusterRef, Liveness, MemberConfig, RuntimeMember};
use crate::resources::TEMPLATE_HASH_ANNOTATION;
use crate::resources::tls::{TLS_ANNOTATION, TlsSchemes, certificate_resource, client_url_for, peer_url_for};
use crate::resources::{
    self, FIELD_MANAGER, MEMBER_CONFIG_ANNOTATION, RELEASED_FROM_ANNOTATION, REMOVED_AT_ANNOTATION,
    REMOVED_MEMBER_LABEL, build_client_service, build_pdb, build_peer_service, build_pod, build_pvc,
    cluster_object_reference, list_selector,
};

/// A `medium: Memory` member as this runtime remembers it.
#[derive(Debug, Clone, Default)]
struct MemoryMember {
    /// The first start configuration.
    config: Option<MemberConfig>,
    /// Its Pod was created (or seen running): a missing Pod now means lost data.
    pod_created: bool,
    /// The planes that use TLS (from the spec it was reserved with).
    tls: TlsSchemes,
}

/// Memory members per cluster (`namespace/name`).
type MemoryMembers = HashMap<String, BTreeMap<String, MemoryMember>>;

/// Runs members as Pods through a Kubernetes API server.
#[derive(Clone)]
pub struct KubernetesRuntime {
    client: Client,
    recorder: Recorder,
    memory: Arc<Mutex<MemoryMembers>>,
    /// The operator's own image: the init containers of members restored from a snapshot.
    operator_image: Option<String>,
    /// The operator's client identity toward each cluster with `auto` client TLS (by
    /// `namespace/name`): issued from the cluster's CA when needed and kept in memory only, so the
    /// credential never leaves the process; a restarted operator issues a new one.
    identities: Arc<Mutex<HashMap<String, crate::tls::member::ClientTls>>>,
    /// The member Pods and PVCs as the controller's watches keep them ([`cache`]).
    cache: ChildCache,
    /// The namespaces whose members' objects are watched (every namespace when empty).
    namespaces: Vec<String>,
    /// Where pre-upgrade snapshots of clusters without a backup destination go (a claim mounted
    /// into the operator's Pod), as `<dir>/<namespace>/<cluster>/`; `None`: not taken.
    snapshots: Option<std::path::PathBuf>,
}

/// On the Pod of a member started with `--force-new-cluster` by [`Runtime::recover_quorum`]:
/// it is started again without the flag before any member is added back (a container restart
/// with the flag would drop them again).
pub const FORCE_NEW_CLUSTER_ANNOTATION: &str = "etcd.operator.dev/force-new-cluster";

/// How often a settled cluster is looked at anyway ([`Runtime::resync_interval`]).
pub const RESYNC_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the Pod reports `Ready=True`.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the Pod was started with `--force-new-cluster` (see [`FORCE_NEW_CLUSTER_ANNOTATION`]).
fn forced_new_cluster(pod: &Pod) -> bool {
    pod.annotations()
        .get(FORCE_NEW_CLUSTER_ANNOTATION)
        .is_some_and(|v| v == "true")
}

impl fmt::Debug for KubernetesRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesRuntime").finish_non_exhaustive()
    }
}

/// The Pod and PVC of one member, as listed.
#[derive(Debug, Default)]
struct MemberObjects {
    pod: Option<Pod>,
    pvc: Option<PersistentVolumeClaim>,
}

fn kube_error(op: &'static str) -> impl FnOnce(kube::Error) -> RuntimeError {
    move |source| RuntimeError::Kube { op, source }
}

/// Records `config` as member `name`'s configuration on its claim `pvc_name` (a merge patch of
/// the annotation its Pod is created from); `op` names the step in an error.
async fn record_config(
    pvcs: &Api<PersistentVolumeClaim>,
    pvc_name: &str,
    name: &str,
    config: &MemberConfig,
    op: &'static str,
) -> Result<(), RuntimeError> {
    let encoded = resources::encode_config(name, config).map_err(|e| RuntimeError::State {
        member: name.to_owned(),
        detail: etcd_operator_api::report::chain(&e),
    })?;
    let patch = json!({ "metadata": { "annotations": { MEMBER_CONFIG_ANNOTATION: encoded } } });
    pvcs.patch(pvc_name, &crate::resources::patch_params(), &Patch::Merge(&patch))
        .await
        .map_err(kube_error(op))?;
    Ok(())
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found())
}

fn is_already_exists(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_already_exists() || status.code == 409)
}

/// Treats "not found" as done (deletes are idempotent).
fn ignore_not_found<T>(result: Result<T, kube::Error>, op: &'static str) -> Result<(), RuntimeError> {
    found(result, op).map(|_| ())
}

/// The object, `None` for a 404.
fn found<T>(result: Result<T, kube::Error>, op: &'static str) -> Result<Option<T>, RuntimeError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if is_not_found(&error) => Ok(None),
        Err(source) => Err(RuntimeError::Kube { op, source }),
    }
}

fn being_deleted<K: Resource>(obj: &K) -> bool {
    obj.meta().deletion_timestamp.is_some()
}

fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Whether a Pod's data volume is a tmpfs emptyDir (`medium: Memory`).
fn is_memory_pod(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|volumes| {
            volumes
                .iter()
                .any(|v| v.name == resources::DATA_VOLUME && v.empty_dir.is_some())
        })
}

/// How often the kubelet restarted the Pod's containers (the etcd container is its only one;
/// init containers do not count).
fn container_restarts(pod: &Pod) -> u32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |statuses| {
            statuses
                .iter()
                .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
                .fold(0, u32::saturating_add)
        })
}

/// A restore init container of the Pod that exited with an error and has not succeeded since
/// (terminated now, or waiting to be restarted after it failed), or that cannot be created (its
/// credentials Secret or a key of it is missing): what it reported, e.g. a checksum mismatch.
fn failed_restore(pod: &Pod) -> Option<crate::restore::RestoreError> {
    let statuses = pod.status.as_ref()?.init_container_statuses.as_ref()?;
    statuses.iter().find_map(|status| {
        let state = status.state.as_ref()?;
        let last = status.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        let terminated = match (&state.terminated, &state.waiting, last) {
            (Some(now), _, _) => now,
            (None, Some(_), Some(last)) => last,
            (None, Some(waiting), None)
                if waiting.reason.as_deref() == Some("CreateContainerConfigError") =>
            {
                return Some(crate::restore::RestoreError::InPod {
                    container: status.name.clone(),
                    message: format!(
                        "it cannot be created: {}",
                        waiting.message.as_deref().unwrap_or("CreateContainerConfigError")
                    ),
                });
            }
            _ => return None,
        };
        if terminated.exit_code == 0 {
            return None;
        }
        let message = terminated
            .message
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map_or_else(|| format!("exit code {}", terminated.exit_code), str::to_owned);
        Some(crate::restore::RestoreError::InPod {
            container: status.name.clone(),
            message,
        })
    })
}

/// The configuration stored on an object, if any.
fn stored_config<K: Resource>(obj: &K, member: &str) -> Result<Option<MemberConfig>, RuntimeError> {
    let Some(value) = obj
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(MEMBER_CONFIG_ANNOTATION))
    else {
        return Ok(None);
    };
    resources::decode_config(value)
        .map(Some)
        .map_err(|e| RuntimeError::State {
            member: member.to_owned(),
            detail: format!(
                "annotation {MEMBER_CONFIG_ANNOTATION} does not hold a member configuration: {}",
                etcd_operator_api::report::Chain(&e)
            ),
        })
}

/// Bytes of a Kubernetes quantity (0 when it does not parse).
fn quantity_bytes(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> u64 {
    etcd_operator_api::quantity::bytes(&q.0).unwrap_or_default()
}

/// What a member's claim says about its volume: requested and actual size, and whether its
/// filesystem waits for the Pod to restart to grow.
fn volume_state(pvc: &PersistentVolumeClaim) -> crate::model::VolumeState {
    let requested = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map_or(0, quantity_bytes);
    let status = pvc.status.as_ref();
    let capacity = status
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map_or(0, quantity_bytes);
    let resize_pending = status.and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "FileSystemResizePending" && c.status == "True")
    });
    crate::model::VolumeState {
        requested,
        capacity,
        resize_pending,
    }
}

/// The TLS planes an object's [`TLS_ANNOTATION`] names, if it carries one.
fn stored_tls<K: Resource>(obj: &K) -> Option<TlsSchemes> {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(TLS_ANNOTATION))
        .map(|value| TlsSchemes::parse(value))
}

/// A merge patch that detaches a kept PVC from its cluster: no cluster or member label (so it is
/// no member any more), no owner reference (so deleting the cluster does not collect it), and an
/// annotation naming where it came from.
fn release_patch(cluster: &ClusterRef, member: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "labels": { naming::CLUSTER_LABEL: null, MEMBER_LABEL: null },
            "ownerReferences": null,
            "annotations": {
                RELEASED_FROM_ANNOTATION: format!("{}/{}/{member}", cluster.namespace, cluster.name),
            },
        }
    })
}

/// The merge patch that sets a removed member's claim aside at `now`: no longer the member's
/// (so nothing adopts it), still the cluster's.
fn set_aside_patch(member: &str, now: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "labels": { MEMBER_LABEL: null, REMOVED_MEMBER_LABEL: member },
            "annotations": { REMOVED_AT_ANNOTATION: now },
        }
    })
}

/// The set-aside claims to delete so that only the `keep` newest remain (by their
/// [`REMOVED_AT_ANNOTATION`]; a claim without a readable time counts as the oldest).
fn set_aside_to_prune(claims: &[PersistentVolumeClaim], keep: usize) -> Vec<String> {
    let mut dated: Vec<(Option<chrono::DateTime<chrono::FixedOffset>>, String)> = claims
        .iter()
        .filter(|c| !being_deleted(*c))
        .map(|c| {
            let at = c
                .annotations()
                .get(REMOVED_AT_ANNOTATION)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            (at, c.name_any())
        })
        .collect();
    // Newest first; equal times by name, so the choice is stable.
    dated.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    dated.into_iter().skip(keep).map(|(_, name)| name).collect()
}

impl KubernetesRuntime {
    /// A runtime acting through `client`; Events are reported as `etcd-operator`. The operator's
    /// image (for restores) is taken from [`resources::OPERATOR_IMAGE_ENV`] when set.
    pub fn new(client: Client) -> Self {
        let recorder = Recorder::new(client.clone(), Reporter::from(FIELD_MANAGER));
        Self {
            client,
            recorder,
            memory: Arc::default(),
            identities: Arc::default(),
            cache: ChildCache::default(),
            operator_image: std::env::var(resources::OPERATOR_IMAGE_ENV)
                .ok()
                .filter(|i| !i.is_empty()),
            namespaces: Vec::new(),
            snapshots: None,
        }
    }

    /// Watches the members' objects only in `namespaces` (a namespace-scoped install, whose
    /// Roles grant nothing elsewhere); empty: every namespace.
    #[must_use]
    pub fn with_namespaces(mut self, namespaces: Vec<String>) -> Self {
        self.namespaces = namespaces;
        self
    }

    /// Keeps pre-upgrade snapshots of clusters without a backup destination under `dir` (the
    /// chart mounts the operator's own claim there), pruned as beside the data in local mode.
    #[must_use]
    pub fn with_snapshot_dir(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.snapshots = dir;
        self
    }

    /// Deletes a member's Pod so that the next start creates it again on its PVC (a version
    /// change, new certificates, a changed template), and says so: a log line and a Normal Event
    /// with `reason` and `note`. A Pod already gone is fine.
    async fn delete_member_pod(
        &self,
        cluster: &ClusterRef,
        name: &str,
        op: &'static str,
        reason: &str,
        note: String,
    ) -> Result<(), RuntimeError> {
        ignore_not_found(
            self.api::<Pod>(cluster)
                .delete(name, &DeleteParams::default())
                .await,
            op,
        )?;
        info!(cluster = %cluster.key(), member = name, %reason, %note, "deleted member Pod");
        self.publish(cluster, reason, "DeletePod", note, None).await;
        Ok(())
    }

    /// Deletes the cluster's set-aside claims beyond the newest [`RETAINED_REMOVED_LIMIT`].
    async fn prune_set_aside(&self, cluster: &ClusterRef) -> Result<(), RuntimeError> {
        let pvcs = self.api::<PersistentVolumeClaim>(cluster);
        let params =
            ListParams::default().labels(&format!("{},{REMOVED_MEMBER_LABEL}", list_selector(cluster)));
        let claims = pvcs
            .list(&params)
            .await
            .map_err(kube_error("list set-aside PersistentVolumeClaims"))?;
        for name in set_aside_to_prune(&claims.items, RETAINED_REMOVED_LIMIT) {
            ignore_not_found(
                pvcs.delete(&name, &DeleteParams::default()).await,
                "delete the oldest set-aside PersistentVolumeClaim",
            )?;
            info!(cluster = %cluster.key(), claim = %name, "deleted the oldest set-aside member volume claim");
        }
        Ok(())
    }

    /// Observes members from `cache` (as [`Runtime::watch_children`] sets it up; tests fill one
    /// by hand) when it can, instead of listing them from the API.
    #[must_use]
    pub fn with_child_cache(mut self, cache: ChildCache) -> Self {
        self.cache = cache;
        self
    }

    /// Deletes Pod `name` (if there) and says whether it is gone: `false` while it stops (its
    /// containers get their grace period), which the caller reports as waiting. Never waits: the
    /// Pod's deletion is a watch event that brings the next reconcile.
    async fn stop_pod(&self, cluster: &ClusterRef, name: &str) -> Result<bool, RuntimeError> {
        let pods = self.api::<Pod>(cluster);
        ignore_not_found(
            pods.delete(name, &DeleteParams::default()).await,
            "delete the member Pod",
        )?;
        let there = pods
            .get_opt(name)
            .await
            .map_err(kube_error("read the member Pod"))?
            .is_some();
        Ok(!there)
    }

    /// Before a member is added back after a quorum recovery: the survivor, started with
    /// `--force-new-cluster`, is started again without it once it serves (its membership is a
    /// one-member cluster by then). Waiting (an error that says so) until it serves, while its
    /// old Pod stops, and while the new Pod starts.
    async fn settle_recovery(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<(), RuntimeError> {
        let params = ListParams::default().labels(&list_selector(cluster));
        let pods = self
            .api::<Pod>(cluster)
            .list(&params)
            .await
            .map_err(kube_error("list the member Pods"))?;
        // Only the survivor of a recovery carries the flag: there is at most one.
        if let Some(pod) = pods.items.iter().find(|p| forced_new_cluster(p)) {
            let name = pod.name_any();
            let waiting = |detail: &str| RuntimeError::Waiting {
                member: name.clone(),
                detail: detail.to_owned(),
            };
            if !being_deleted(pod) && !pod_ready(pod) {
                return Err(waiting(
                    "it was started with --force-new-cluster and does not serve yet; members are added back once it does",
                ));
            }
            if !self.stop_pod(cluster, &name).await? {
                return Err(waiting("its Pod started with --force-new-cluster is stopping"));
            }
            let pvc = self
                .api::<PersistentVolumeClaim>(cluster)
                .get_opt(&naming::member_pvc_name(&name))
                .await
                .map_err(kube_error("read the member PersistentVolumeClaim"))?;
            let config = pvc
                .as_ref()
                .map(|p| stored_config(p, &name))
                .transpose()?
                .flatten()
                .ok_or_else(|| RuntimeError::State {
                    member: name.clone(),
                    detail: "its volume claim holds no configuration to restart it with".to_owned(),
                })?;
            self.create_pod(cluster, spec, &name, &config).await?;
            info!(cluster = %cluster.key(), member = %name, "restarted the recovered member without --force-new-cluster");
            return Err(waiting(
                "it was restarted without --force-new-cluster; members are added back once it serves",
            ));
        }
        Ok(())
    }

    /// Uses `image` (or none) as the operator's image in the restore init containers.
    #[must_use]
    pub fn with_operator_image(mut self, image: Option<String>) -> Self {
        self.operator_image = image;
        self
    }

    /// Whether a member restored from `plan` can be started here: the operator's image is known
    /// and the member Pods can reach the snapshot (checked before any API call).
    fn check_restore(&self, name: &str, plan: &crate::restore::RestorePlan) -> Result<(), RuntimeError> {
        let failed = |source| RuntimeError::Restore {
            member: name.to_owned(),
            source: Box::new(source),
        };
        if self.operator_image.is_none() {
            return Err(failed(crate::restore::RestoreError::OperatorImageUnknown(
                resources::OPERATOR_IMAGE_ENV,
            )));
        }
        crate::restore::check_reachable_from_pod(plan).map_err(failed)
    }

    fn api<K>(&self, cluster: &ClusterRef) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &cluster.namespace)
    }

    /// Runs `f` on the memory members of `cluster`.
    fn with_memory<T>(
        &self,
        cluster: &ClusterRef,
        f: impl FnOnce(&mut BTreeMap<String, MemoryMember>) -> T,
    ) -> T {
        let mut all = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        let members = all.entry(cluster.key()).or_default();
        let out = f(members);
        if members.is_empty() {
            all.remove(&cluster.key());
        }
        out
    }

    /// The Pods and PVCs of the cluster, grouped by member: from the controller's watches when
    /// they can answer ([`ChildCache::read`]), else listed from the API.
    async fn list_objects(
        &self,
        cluster: &ClusterRef,
    ) -> Result<BTreeMap<String, MemberObjects>, RuntimeError> {
        let (pods, pvcs) = match self.cache.read(cluster) {
            Some(cached) => cached,
            None => {
                let params = ListParams::default().labels(&list_selector(cluster));
                let pods = self
                    .api::<Pod>(cluster)
                    .list(&params)
                    .await
                    .map_err(kube_error("list member Pods"))?;
                let pvcs = self
                    .api::<PersistentVolumeClaim>(cluster)
                    .list(&params)
                    .await
                    .map_err(kube_error("list member PersistentVolumeClaims"))?;
                (pods.items, pvcs.items)
            }
        };
        let mut objects: BTreeMap<String, MemberObjects> = BTreeMap::new();
        for pod in pods {
            match pod.labels().get(MEMBER_LABEL).cloned() {
                Some(member) => objects.entry(member).or_default().pod = Some(pod),
                None => debug!(pod = %pod.name_any(), "ignoring a Pod without the member label"),
            }
        }
        for pvc in pvcs {
            match pvc.labels().get(MEMBER_LABEL).cloned() {
                Some(member) => objects.entry(member).or_default().pvc = Some(pvc),
                None => debug!(pvc = %pvc.name_any(), "ignoring a PVC without the member label"),
            }
        }
        Ok(objects)
    }

    /// Classifies one member; `None` when it is on its way out.
    fn classify(
        &self,
        cluster: &ClusterRef,
        name: &str,
        objects: &MemberObjects,
        memory: Option<&MemoryMember>,
    ) -> Result<Option<RuntimeMember>, RuntimeError> {
        let pod = objects.pod.as_ref();
        let pvc = objects.pvc.as_ref();
        let pod_alive = pod.is_some_and(|p| !being_deleted(p));
        let pvc_alive = pvc.is_some_and(|p| !being_deleted(p));
        let remembered = memory.is_some();
        if !pod_alive && !pvc_alive && !remembered {
            return Ok(None);
        }
        // The PVC holds the authoritative configuration (a version change updates it before the
        // old Pod is gone); the Pod's copy serves members without a PVC.
        let config = match pvc.map(|p| stored_config(p, name)).transpose()?.flatten() {
            Some(config) => Some(config),
            None => match pod.map(|p| stored_config(p, name)).transpose()?.flatten() {
                Some(config) => Some(config),
                None => memory.and_then(|m| m.config.clone()),
            },
        };
        let liveness = match pod {
            Some(pod) if !being_deleted(pod) => match pod_phase(pod) {
                phase @ ("Failed" | "Succeeded") => Liveness::Gone {
                    reason: format!("Pod {name} has phase {phase}"),
                    restartable: pvc.is_some(),
                },
                _ if pvc.is_some_and(being_deleted) => Liveness::Gone {
                    reason: format!("the PersistentVolumeClaim of member {name} is being deleted"),
                    restartable: false,
                },
                _ => Liveness::Running,
            },
            Some(_) => Liveness::Gone {
                reason: format!("Pod {name} is being deleted"),
                restartable: pvc.is_some_and(|p| !being_deleted(p)),
            },
            None if memory.is_some_and(|m| m.pod_created) => Liveness::Gone {
                reason: format!("Pod {name} is gone and with it the member's in-memory data"),
                restartable: false,
            },
            None if pvc.is_some() && config.is_some() => Liveness::Gone {
                reason: format!("Pod {name} is missing"),
                restartable: true,
            },
            None => Liveness::Reserved,
        };
        let tls = pvc
            .and_then(stored_tls)
            .or_else(|| pod.and_then(stored_tls))
            .or_else(|| memory.map(|m| m.tls))
            .unwrap_or_default();
        Ok(Some(RuntimeMember {
            name: name.to_owned(),
            peer_url: peer_url_for(cluster, name, tls),
            client_url: client_url_for(cluster, name, tls),
            config,
            liveness,
            certificates: None,
            restarts: pod.map_or(0, container_restarts),
            template_hash: pod
                .filter(|p| !being_deleted(*p))
                .and_then(|p| p.annotations().get(TEMPLATE_HASH_ANNOTATION).cloned()),
            volume: pvc.filter(|p| !being_deleted(*p)).map(volume_state),
            created: pvc
                .and_then(|p| p.metadata.creation_timestamp.as_ref())
                .or_else(|| pod.and_then(|p| p.metadata.creation_timestamp.as_ref()))
                .and_then(crate::backup_policy::from_time),
        }))
    }

    /// Every member, with memory members seen running remembered.
    async fn list_members(&self, cluster: &ClusterRef) -> Result<Vec<RuntimeMember>, RuntimeError> {
        let mut objects = self.list_objects(cluster).await?;
        // A restore that failed in a member's init containers (its Pod stays Pending while the
        // kubelet retries them) while no member serves: reported as the local runtime reports a
        // failed restore, as `RestoreFailed` with the container's message, rather than waited out
        // as a slow bootstrap. Once a member serves, such a member is only one that does not
        // start, and is treated as any other.
        let serving = objects
            .values()
            .any(|m| m.pod.as_ref().is_some_and(|p| !being_deleted(p) && pod_ready(p)));
        for (name, member) in objects.iter().filter(|_| !serving) {
            if let Some(source) = member
                .pod
                .as_ref()
                .filter(|p| !being_deleted(*p))
                .and_then(failed_restore)
            {
                return Err(RuntimeError::Restore {
                    member: name.clone(),
                    source: Box::new(source),
                });
            }
        }
        let memory = self.with_memory(cluster, |remembered| {
            // Adopt running memory members (e.g. after an operator restart), so that their Pod
            // disappearing later is reported as `Gone`.
            for (name, member) in &objects {
                if let Some(pod) = member
                    .pod
                    .as_ref()
                    .filter(|p| !being_deleted(*p) && is_memory_pod(p))
                {
                    let entry = remembered.entry(name.clone()).or_default();
                    entry.pod_created = true;
                    if entry.config.is_none() {
                        entry.config = stored_config(pod, name).ok().flatten();
                    }
                }
            }
            remembered.clone()
        });
        for name in memory.keys() {
            objects.entry(name.clone()).or_default();
        }
        let mut members = Vec::with_capacity(objects.len());
        for (name, member) in &objects {
            if let Some(m) = self.classify(cluster, name, member, memory.get(name))? {
                members.push(m);
            }
        }
        // Members with TLS report their `auto` certificates (a cluster without TLS costs no call).
        if members
            .iter()
            .any(|m| m.client_url.starts_with("https:") || m.peer_url.starts_with("https:"))
        {
            let secrets = self.member_secrets(cluster).await?;
            for member in &mut members {
                member.certificates = secrets.get(&member.name).map(|(certs, issued_at)| {
                    let mut certs = certs.clone();
                    // A Pod created before its Secret was last written runs on what the Secret
                    // held before (etcd reads its certificates and CAs as it starts).
                    let created = objects
                        .get(&member.name)
                        .and_then(|o| o.pod.as_ref())
                        .filter(|p| !being_deleted(*p))
                        .and_then(|p| p.metadata.creation_timestamp.as_ref())
                        .map(|t| t.0.as_second());
                    if let (Some(created), Some(issued)) = (created, issued_at)
                        && created < issued.as_second()
                        && certs.authority.is_none()
                    {
                        certs.authority = Some(crate::tls::authority::AuthorityLag::Trust);
                    }
                    certs
                });
            }
        }
        Ok(members)
    }

    /// Applies the peer and client Services (server-side apply, forced).
    async fn apply_services(&self, cluster: &ClusterRef) -> Result<(), RuntimeError> {
        let services = self.api::<Service>(cluster);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let peer = build_peer_service(cluster);
        services
            .patch(&peer.name_any(), &params, &Patch::Apply(&peer))
            .await
            .map_err(kube_error("apply the peer Service"))?;
        let client = build_client_service(cluster);
        services
            .patch(&client.name_any(), &params, &Patch::Apply(&client))
            .await
            .map_err(kube_error("apply the client Service"))?;
        Ok(())
    }

    /// Applies the PodDisruptionBudget for the quorum of `members` members.
    async fn apply_pdb(&self, cluster: &ClusterRef, members: usize) -> Result<(), RuntimeError> {
        let pdb = build_pdb(cluster, members);
        self.api::<PodDisruptionBudget>(cluster)
            .patch(
                &pdb.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&pdb),
            )
            .await
            .map_err(kube_error("apply the PodDisruptionBudget"))?;
        Ok(())
    }

    /// Creates the member's PVC unless it exists; returns the configuration it records.
    async fn ensure_pvc(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<Option<MemberConfig>, RuntimeError> {
        let pvcs = self.api::<PersistentVolumeClaim>(cluster);
        let pvc = build_pvc(cluster, spec, name);
        match pvcs.create(&crate::resources::post_params(), &pvc).await {
            Ok(_) => {
                info!(cluster = %cluster.key(), member = name, pvc = %pvc.name_any(), "created member PVC");
                Ok(None)
            }
            Err(error) if is_already_exists(&error) => {
                let existing = pvcs
                    .get(&pvc.name_any())
                    .await
                    .map_err(kube_error("read the member PersistentVolumeClaim"))?;
                // A removed member's claim is kept to be looked at, never started on.
                if let Some(removed) = existing.labels().get(REMOVED_MEMBER_LABEL) {
                    return Err(RuntimeError::State {
                        member: name.to_owned(),
                        detail: format!(
                            "PersistentVolumeClaim {} holds the data of removed member {removed} (set aside); a new member is not started on it",
                            pvc.name_any()
                        ),
                    });
                }
                stored_config(&existing, name)
            }
            Err(source) => Err(RuntimeError::Kube {
                op: "create the member PersistentVolumeClaim",
                source,
            }),
        }
    }

    /// Records `config` on the member's PVC unless one is recorded; returns the recorded one.
    async fn record_config_on_pvc(
        &self,
        cluster: &ClusterRef,
        name: &str,
        config: &MemberConfig,
    ) -> Result<MemberConfig, RuntimeError> {
        let pvcs = self.api::<PersistentVolumeClaim>(cluster);
        let pvc_name = naming::member_pvc_name(name);
        let Some(pvc) = pvcs
            .get_opt(&pvc_name)
            .await
            .map_err(kube_error("read the member PersistentVolumeClaim"))?
        else {
            return Err(RuntimeError::UnknownMember {
                name: name.to_owned(),
            });
        };
        if being_deleted(&pvc) {
            // A Pod on it would never start: the member has to be replaced.
            return Err(RuntimeError::State {
                member: name.to_owned(),
                detail: format!("its PersistentVolumeClaim {pvc_name} is being deleted"),
            });
        }
        if let Some(recorded) = stored_config(&pvc, name)? {
            if &recorded != config {
                debug!(cluster = %cluster.key(), member = name, "member keeps its first configuration");
            }
            return Ok(recorded);
        }
        record_config(
            &pvcs,
            &pvc_name,
            name,
            config,
            "record the member configuration on its PersistentVolumeClaim",
        )
        .await?;
        Ok(config.clone())
    }

    /// Makes sure of the member's certificates (see [`tls`]), then creates its Pod.
    async fn create_pod(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        config: &MemberConfig,
    ) -> Result<(), RuntimeError> {
        self.ensure_member_tls(cluster, spec, name).await?;
        self.apply_pod(cluster, spec, name, config, false).await
    }

    /// Creates the member Pod (server-side apply) and reports an Event; with
    /// `force_new_cluster`, etcd starts with `--force-new-cluster` and the Pod carries
    /// [`FORCE_NEW_CLUSTER_ANNOTATION`].
    async fn apply_pod(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        config: &MemberConfig,
        force_new_cluster: bool,
    ) -> Result<(), RuntimeError> {
        let mut pod = build_pod(
            cluster,
            spec,
            name,
            config,
            self.operator_image.as_deref(),
            force_new_cluster,
        )
        .map_err(|e| match e {
            resources::ResourceError::Restore { member, source } => RuntimeError::Restore { member, source },
            other => RuntimeError::State {
                member: name.to_owned(),
                detail: other.to_string(),
            },
        })?;
        if force_new_cluster {
            pod.annotations_mut()
                .insert(FORCE_NEW_CLUSTER_ANNOTATION.to_owned(), "true".to_owned());
        }
        let created = self
            .api::<Pod>(cluster)
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&pod),
            )
            .await
            .map_err(kube_error("create the member Pod"))?;
        info!(cluster = %cluster.key(), member = name, version = %config.version, "created member Pod");
        self.publish(
            cluster,
            "MemberPodCreated",
            "CreatePod",
            format!("Created member Pod {name} (etcd {})", config.version),
            Some(created.object_ref(&())),
        )
        .await;
        Ok(())
    }

    /// Reports a Normal Event on the EtcdCluster; a failure is logged, never returned.
    async fn publish(
        &self,
        cluster: &ClusterRef,
        reason: &str,
        action: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        self.record(cluster, EventType::Normal, reason, action, note, related)
            .await;
    }

    /// Reports a Warning Event on the EtcdCluster; a failure is logged, never returned.
    async fn publish_warning(
        &self,
        cluster: &ClusterRef,
        reason: &str,
        action: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        self.record(cluster, EventType::Warning, reason, action, note, related)
            .await;
    }

    /// Reports a [`super::events::Report`] (the content both runtimes share) on the EtcdCluster.
    async fn report(
        &self,
        cluster: &ClusterRef,
        report: super::events::Report,
        related: Option<ObjectReference>,
    ) {
        let type_ = match report.type_ {
            super::events::EventType::Normal => EventType::Normal,
            super::events::EventType::Warning => EventType::Warning,
        };
        self.record(
            cluster,
            type_,
            &report.reason,
            &report.action,
            report.note,
            related,
        )
        .await;
    }

    async fn record(
        &self,
        cluster: &ClusterRef,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: related,
        };
        if let Err(error) = self
            .recorder
            .publish(&event, &cluster_object_reference(cluster))
            .await
        {
            warn!(cluster = %cluster.key(), error = %etcd_operator_api::report::Chain(&error), reason, "could not record an Event");
        }
    }

    /// `start` found the member's Pod: nothing to do while it runs; a stopped one (evicted,
    /// node shut down) is deleted so that the next `start` recreates it on the same PVC.
    async fn handle_existing_pod(
        &self,
        cluster: &ClusterRef,
        name: &str,
        pod: &Pod,
    ) -> Result<(), RuntimeError> {
        if being_deleted(pod) {
            info!(cluster = %cluster.key(), member = name, "member Pod is being deleted; it is recreated once gone");
            return Ok(());
        }
        if let Some(source) = failed_restore(pod) {
            return Err(RuntimeError::Restore {
                member: name.to_owned(),
                source: Box::new(source),
            });
        }
        let phase = pod_phase(pod);
        if matches!(phase, "Failed" | "Succeeded") {
            info!(cluster = %cluster.key(), member = name, phase, "deleting the stopped member Pod to recreate it");
            ignore_not_found(
                self.api::<Pod>(cluster)
                    .delete(name, &DeleteParams::default())
                    .await,
                "delete the stopped member Pod",
            )?;
        }
        Ok(())
    }
}

impl Runtime for KubernetesRuntime {
    async fn members(&self, cluster: &ClusterRef) -> Result<Vec<RuntimeMember>, RuntimeError> {
        self.list_members(cluster).await
    }

    async fn reserve(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<RuntimeMember, RuntimeError> {
        self.cache.wrote(cluster);
        self.settle_recovery(cluster, spec).await?;
        self.apply_services(cluster).await?;
        let existing = self.list_members(cluster).await?;
        let counted = existing.iter().filter(|m| m.name != name).count() + 1;
        let desired = spec.replicas;
        self.apply_pdb(cluster, counted.max(desired)).await?;
        let tls = TlsSchemes::of(&spec.tls);
        let config = match spec.storage.medium {
            Some(StorageMedium::Memory) => self.with_memory(cluster, |members| {
                let member = members.entry(name.to_owned()).or_default();
                member.tls = tls;
                member.config.clone()
            }),
            _ => self.ensure_pvc(cluster, spec, name).await?,
        };
        Ok(RuntimeMember {
            name: name.to_owned(),
            peer_url: peer_url_for(cluster, name, tls),
            client_url: client_url_for(cluster, name, tls),
            config,
            liveness: Liveness::Reserved,
            certificates: None,
            restarts: 0,
            template_hash: None,
            volume: None,
            // Known once the claim (or Pod) is listed.
            created: None,
        })
    }

    async fn start(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        config: &MemberConfig,
    ) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        if let Some(plan) = &config.restore {
            // Refused before anything is created: a Pod whose init containers cannot fetch the
            // snapshot would only hang.
            self.check_restore(name, plan)?;
        }
        let memory = matches!(spec.storage.medium, Some(StorageMedium::Memory));
        let config = if memory {
            // The first configuration wins, as on a PVC.
            self.with_memory(cluster, |members| {
                let member = members.get_mut(name)?;
                Some(member.config.get_or_insert_with(|| config.clone()).clone())
            })
            .ok_or_else(|| RuntimeError::UnknownMember {
                name: name.to_owned(),
            })?
        } else {
            self.record_config_on_pvc(cluster, name, config).await?
        };

        let pod = self
            .api::<Pod>(cluster)
            .get_opt(name)
            .await
            .map_err(kube_error("read the member Pod"))?;
        if let Some(pod) = pod {
            if memory && (being_deleted(&pod) || matches!(pod_phase(&pod), "Failed" | "Succeeded")) {
                return Err(RuntimeError::State {
                    member: name.to_owned(),
                    detail: "its memory-backed Pod stopped and its data is lost; replace the member"
                        .to_owned(),
                });
            }
            return self.handle_existing_pod(cluster, name, &pod).await;
        }
        if memory
            && self.with_memory(cluster, |members| {
                members.get(name).is_some_and(|m| m.pod_created)
            })
        {
            return Err(RuntimeError::State {
                member: name.to_owned(),
                detail: "its memory-backed Pod is gone and its data with it; replace the member".to_owned(),
            });
        }
        self.create_pod(cluster, spec, name, &config).await?;
        if memory {
            self.with_memory(cluster, |members| {
                members.entry(name.to_owned()).or_default().pod_created = true;
            });
        }
        Ok(())
    }

    async fn change_version(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        version: &str,
    ) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        if matches!(spec.storage.medium, Some(StorageMedium::Memory)) {
            return Err(RuntimeError::State {
                member: name.to_owned(),
                detail: "a memory-backed member loses its data when its Pod stops, so it cannot change version in place".to_owned(),
            });
        }
        let pvcs = self.api::<PersistentVolumeClaim>(cluster);
        let pvc_name = naming::member_pvc_name(name);
        let pvc = pvcs
            .get_opt(&pvc_name)
            .await
            .map_err(kube_error("read the member PersistentVolumeClaim"))?
            .ok_or_else(|| RuntimeError::UnknownMember {
                name: name.to_owned(),
            })?;
        let Some(mut config) = stored_config(&pvc, name)? else {
            return Err(RuntimeError::State {
                member: name.to_owned(),
                detail: "it was never started, so it has no version to change".to_owned(),
            });
        };
        if config.version == version {
            // Already recorded (an earlier call, or an operator restarted mid-change): make sure
            // a Pod runs; one still being deleted is recreated by a later start.
            let pod = self
                .api::<Pod>(cluster)
                .get_opt(name)
                .await
                .map_err(kube_error("read the member Pod"))?;
            if pod.is_none() {
                self.create_pod(cluster, spec, name, &config).await?;
            }
            return Ok(());
        }
        let from = std::mem::replace(&mut config.version, version.to_owned());
        config.previous_version = Some(from.clone());
        // Record on the PVC first: the Pod is recreated from it, also by a restarted operator.
        record_config(
            &pvcs,
            &pvc_name,
            name,
            &config,
            "record the new version on the member PersistentVolumeClaim",
        )
        .await?;
        self.delete_member_pod(
            cluster,
            name,
            "delete the member Pod to change its version",
            "MemberVersionChanging",
            format!(
                "Deleted Pod {name} to recreate it on PersistentVolumeClaim {pvc_name} with etcd {version} (was {from})"
            ),
        )
        .await?;
        Ok(())
    }

    /// Issues the member's `auto` certificates again when they are due (expiring, of another CA,
    /// another rotation) and deletes its Pod so that it comes back on its PVC with them, as a
    /// version change does. Certificates that are good are kept, and the call only makes sure the
    /// member runs on them (a Pod created before they were issued is restarted too).
    async fn renew_certificates(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        if matches!(spec.storage.medium, Some(StorageMedium::Memory)) {
            return Err(RuntimeError::State {
                member: name.to_owned(),
                detail: "a memory-backed member loses its data when its Pod stops, so it cannot be restarted on new certificates; replace the member".to_owned(),
            });
        }
        let pvc = self
            .api::<PersistentVolumeClaim>(cluster)
            .get_opt(&naming::member_pvc_name(name))
            .await
            .map_err(kube_error("read the member PersistentVolumeClaim"))?
            .ok_or_else(|| RuntimeError::UnknownMember {
                name: name.to_owned(),
            })?;
        let Some(config) = stored_config(&pvc, name)? else {
            return Err(RuntimeError::State {
                member: name.to_owned(),
                detail: "it was never started, so it has no certificates to renew".to_owned(),
            });
        };
        let issued = self.ensure_member_tls(cluster, spec, name).await?;
        let pod = self
            .api::<Pod>(cluster)
            .get_opt(name)
            .await
            .map_err(kube_error("read the member Pod"))?;
        let Some(pod) = pod else {
            return self.apply_pod(cluster, spec, name, &config, false).await;
        };
        if being_deleted(&pod) {
            // Recreated by the next start, on the Secret as it is now.
            return Ok(());
        }
        let reason = match issued {
            Some(reason) => reason,
            None => {
                // Good certificates: restart only a Pod older than them.
                let issued_at = self
                    .member_secrets(cluster)
                    .await?
                    .remove(name)
                    .and_then(|(_, at)| at);
                let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
                match (issued_at, created) {
                    (Some(issued), Some(created)) if created.as_second() < issued.as_second() => {
                        "its Pod was created before its current certificates were issued".to_owned()
                    }
                    _ => return Ok(()),
                }
            }
        };
        self.delete_member_pod(
            cluster,
            name,
            "delete the member Pod to restart it on new certificates",
            "MemberCertificatesRenewed",
            super::events::Report::member_certificates_renewed(
                "DeletePod",
                &format!(
                    "Deleted Pod {name} to restart it on PersistentVolumeClaim {}",
                    naming::member_pvc_name(name)
                ),
                &reason,
            )
            .note,
        )
        .await?;
        Ok(())
    }

    async fn authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<crate::tls::authority::AuthorityView>, RuntimeError> {
        self.authority_view(cluster, spec).await
    }

    async fn advance_authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        to: crate::tls::authority::AuthorityPhase,
        rotation: Option<&str>,
    ) -> Result<(), RuntimeError> {
        self.advance_authority_to(cluster, spec, to, rotation).await
    }

    fn template_hash(&self, cluster: &ClusterRef, spec: &ValidatedCluster) -> Option<String> {
        resources::template_hash(cluster, spec)
    }

    /// Grows the member's claim to `spec`'s size, once its StorageClass allows expansion (the
    /// check kube-apiserver's `PersistentVolumeClaimResize` admission makes too, said here with
    /// the class's name). Idempotent: a claim already that large is left alone.
    async fn expand_volume(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let Some(bytes) = spec.volume_bytes else {
            return Ok(());
        };
        self.cache.wrote(cluster);
        let claims = self.api::<PersistentVolumeClaim>(cluster);
        let claim = naming::member_pvc_name(name);
        let pvc = claims
            .get_opt(&claim)
            .await
            .map_err(kube_error("read the member PersistentVolumeClaim"))?
            .ok_or_else(|| RuntimeError::UnknownMember {
                name: name.to_owned(),
            })?;
        if volume_state(&pvc).requested >= bytes {
            return Ok(());
        }
        let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(self.client.clone());
        let class = match &class_name {
            Some(class) => classes.get_opt(class).await.map_err(kube_error(
                "read the StorageClass of the member PersistentVolumeClaim",
            ))?,
            None => None,
        };
        if class
            .as_ref()
            .is_none_or(|c| c.allow_volume_expansion != Some(true))
        {
            return Err(RuntimeError::VolumeExpansionNotAllowed {
                claim: format!("{}/{claim}", cluster.namespace),
                class: class_name.unwrap_or_else(|| "(none)".to_owned()),
                found: class.is_some(),
            });
        }
        let size = spec
            .storage
            .size
            .as_ref()
            .map(|q| q.0.clone())
            .unwrap_or_else(|| bytes.to_string());
        let patch = json!({ "spec": { "resources": { "requests": { "storage": size } } } });
        claims
            .patch(&claim, &crate::resources::patch_params(), &Patch::Merge(&patch))
            .await
            .map_err(kube_error("grow the member PersistentVolumeClaim"))?;
        info!(cluster = %cluster.key(), member = name, %size, "grew the member PersistentVolumeClaim");
        self.publish(
            cluster,
            "VolumeExpanding",
            "ExpandVolume",
            format!("Asked PersistentVolumeClaim {claim} of member {name} to grow to {size}"),
            None,
        )
        .await;
        Ok(())
    }

    /// Deletes the member's Pod when it was built from another template; the next start
    /// creates it anew from `spec` on its PersistentVolumeClaim, as a version change does.
    async fn recreate(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        if matches!(spec.storage.medium, Some(StorageMedium::Memory)) {
            return Err(RuntimeError::State {
                member: name.to_owned(),
                detail: "a memory-backed member loses its data when its Pod stops, so it is replaced rather than re-created".to_owned(),
            });
        }
        let pods = self.api::<Pod>(cluster);
        let pod = pods
            .get_opt(name)
            .await
            .map_err(kube_error("read the member Pod"))?;
        let Some(pod) = pod.filter(|p| !being_deleted(p)) else {
            // Gone or going: the next start creates it from `spec`.
            return Ok(());
        };
        let wanted = resources::template_hash(cluster, spec);
        let had = pod.annotations().get(TEMPLATE_HASH_ANNOTATION).cloned();
        if had == wanted {
            return Ok(());
        }
        self.delete_member_pod(
            cluster,
            name,
            "delete the member Pod to re-create it on the new template",
            "MemberTemplateChanging",
            format!(
                "Deleted Pod {name} to re-create it on PersistentVolumeClaim {} from the changed member template ({} -> {})",
                naming::member_pvc_name(name),
                had.as_deref().unwrap_or("none"),
                wanted.as_deref().unwrap_or("none"),
            ),
        )
        .await
    }

    /// Every other member is removed with its volume claim released (kept, as `remove` with
    /// data kept does), the survivor's Pod stops, and it starts again on its volume with
    /// `--force-new-cluster`: a one-member cluster on its data. Before the first member is added
    /// back, [`Runtime::reserve`] starts it once more without the flag.
    async fn recover_quorum(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        survivor: &str,
    ) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        let state = |detail: &str| RuntimeError::State {
            member: survivor.to_owned(),
            detail: detail.to_owned(),
        };
        if matches!(spec.storage.medium, Some(StorageMedium::Memory)) {
            return Err(state(
                "a memory-backed member loses its data when its Pod stops, so a cluster cannot be rebuilt from it",
            ));
        }
        let pvc = self
            .api::<PersistentVolumeClaim>(cluster)
            .get_opt(&naming::member_pvc_name(survivor))
            .await
            .map_err(kube_error("read the member PersistentVolumeClaim"))?
            .filter(|p| !being_deleted(p))
            .ok_or_else(|| state("it has no volume claim to recover from"))?;
        let config = stored_config(&pvc, survivor)?
            .ok_or_else(|| state("its volume claim holds no configuration: it never started"))?;
        let existing = self
            .api::<Pod>(cluster)
            .get_opt(survivor)
            .await
            .map_err(kube_error("read the member Pod"))?;
        if existing
            .as_ref()
            .is_some_and(|p| forced_new_cluster(p) && !being_deleted(p))
        {
            // Called again after it already started with the flag: nothing more to do.
            return Ok(());
        }
        for member in self.list_members(cluster).await? {
            if member.name != survivor {
                Runtime::remove(self, cluster, &member.name, true).await?;
            }
        }
        if !self.stop_pod(cluster, survivor).await? {
            return Err(RuntimeError::Waiting {
                member: survivor.to_owned(),
                detail: "its Pod is stopping before it starts again with --force-new-cluster".to_owned(),
            });
        }
        self.ensure_member_tls(cluster, spec, survivor).await?;
        self.apply_pod(cluster, spec, survivor, &config, true).await?;
        self.report(
            cluster,
            super::events::Report::quorum_recovered(
                survivor,
                "the other members' volume claims were released, not deleted",
            ),
            None,
        )
        .await;
        Ok(())
    }

    async fn stop(&self, cluster: &ClusterRef, name: &str) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        ignore_not_found(
            self.api::<Pod>(cluster)
                .delete(name, &DeleteParams::default())
                .await,
            "delete the member Pod to stop it",
        )?;
        info!(cluster = %cluster.key(), member = name, "stopped member (deleted its Pod, kept its volume claim)");
        Ok(())
    }

    fn snapshot_dir(&self, cluster: &ClusterRef) -> Option<std::path::PathBuf> {
        // The members' volumes are mounted only by their Pods: the operator's own claim (when
        // mounted) is its place, one directory per cluster.
        self.snapshots
            .as_ref()
            .map(|dir| dir.join(&cluster.namespace).join(&cluster.name))
    }

    /// A Warning Event on the EtcdCluster, reason `MemberReplacing`, naming the member's Pod.
    async fn announce_replacement(&self, cluster: &ClusterRef, member: &str, note: &str) {
        let pod = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(cluster.namespace.clone()),
            name: Some(member.to_owned()),
            ..ObjectReference::default()
        };
        self.report(cluster, super::events::Report::member_replacing(note), Some(pod))
            .await;
    }

    async fn warn(&self, cluster: &ClusterRef, reason: &str, action: &str, note: &str) {
        self.report(
            cluster,
            super::events::Report::warning(reason, action, note),
            None,
        )
        .await;
    }

    async fn remove(&self, cluster: &ClusterRef, name: &str, keep_data: bool) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        ignore_not_found(
            self.api::<Pod>(cluster)
                .delete(name, &DeleteParams::default())
                .await,
            "delete the member Pod",
        )?;
        let pvcs = self.api::<PersistentVolumeClaim>(cluster);
        let pvc_name = naming::member_pvc_name(name);
        let set_aside = if keep_data {
            ignore_not_found(
                pvcs.patch(
                    &pvc_name,
                    &crate::resources::patch_params(),
                    &Patch::Merge(&release_patch(cluster, name)),
                )
                .await,
                "release the member PersistentVolumeClaim",
            )?;
            false
        } else {
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let patched = found(
                pvcs.patch(
                    &pvc_name,
                    &crate::resources::patch_params(),
                    &Patch::Merge(&set_aside_patch(name, &now)),
                )
                .await,
                "set the member PersistentVolumeClaim aside",
            )?;
            match patched {
                // A member that never started (no configuration recorded) has nothing to look
                // at: its claim goes, rather than pushing a removed member's data out.
                Some(claim) if !claim.annotations().contains_key(MEMBER_CONFIG_ANNOTATION) => {
                    ignore_not_found(
                        pvcs.delete(&pvc_name, &DeleteParams::default()).await,
                        "delete the member PersistentVolumeClaim",
                    )?;
                    false
                }
                Some(_) => {
                    self.prune_set_aside(cluster).await?;
                    true
                }
                None => false,
            }
        };
        // Its certificates: cert-manager's Certificates first (else their Secrets come back),
        // then every Secret of the member (`auto`, cert-manager's, labelled with the member).
        // Without cert-manager installed there is no Certificate resource: nothing to delete.
        let member_selector =
            ListParams::default().labels(&format!("{},{MEMBER_LABEL}={name}", list_selector(cluster)));
        let certificates: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &cluster.namespace, &certificate_resource());
        ignore_not_found(
            certificates
                .delete_collection(&DeleteParams::default(), &member_selector)
                .await,
            "delete the member's cert-manager Certificates",
        )?;
        ignore_not_found(
            self.api::<Secret>(cluster)
                .delete_collection(&DeleteParams::default(), &member_selector)
                .await,
            "delete the member's certificate Secrets",
        )?;
        self.with_memory(cluster, |members| members.remove(name));
        info!(cluster = %cluster.key(), member = name, keep_data, "removed member");

        let remaining = self
            .list_members(cluster)
            .await?
            .iter()
            .filter(|m| m.name != name)
            .count();
        self.apply_pdb(cluster, remaining).await?;
        let kept = if keep_data {
            format!(", kept its volume claim {pvc_name}")
        } else if set_aside {
            format!(
                ", set its volume claim {pvc_name} aside (the newest {RETAINED_REMOVED_LIMIT} removed members' claims stay until the cluster is deleted)"
            )
        } else {
            String::new()
        };
        self.report(
            cluster,
            super::events::Report::member_removed(name, "DeletePod", &kept),
            None,
        )
        .await;
        Ok(())
    }

    /// The operator's identity toward the members (see [`tls`]): a client certificate of the
    /// cluster's `auto` client CA (created on first use), the `secretRef` Secret's pair, or the
    /// operator's cert-manager Certificate; `None` when the client plane is plain HTTP.
    async fn client_tls(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<crate::tls::member::ClientTls>, RuntimeError> {
        self.operator_identity(cluster, spec).await
    }

    /// The member Pods and PVCs (owned by their EtcdCluster, labelled with its name): a Pod
    /// deleted, failing or turning ready, a claim lost, reconciles the cluster at once.
    fn watch_children(
        &self,
        controller: kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>,
    ) -> kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster> {
        let (pods, pvcs, secrets) = self.cache.watch(
            &self.client,
            &self.namespaces,
            etcd_operator_api::naming::CLUSTER_LABEL,
        );
        controller
            .owns_stream(pods)
            .owns_stream(pvcs)
            .owns_stream(secrets)
    }

    /// Pods report their changes (a member that turns unhealthy fails its readiness probe, an
    /// event too); the resync only catches what etcd alone knows (alarms, database sizes, a
    /// leader change). Observing a settled cluster reads the controller's watches, so the resync
    /// costs etcd probes and, when etcd's answers changed, one status write: at most one API
    /// request per cluster per minute.
    fn resync_interval(&self) -> std::time::Duration {
        RESYNC_INTERVAL
    }

    async fn teardown(&self, cluster: &ClusterRef, keep_data: bool) -> Result<(), RuntimeError> {
        self.cache.wrote(cluster);
        let params = ListParams::default().labels(&list_selector(cluster));
        self.api::<Pod>(cluster)
            .delete_collection(&DeleteParams::default(), &params)
            .await
            .map_err(kube_error("delete the member Pods"))?;
        let pvcs = self.api::<PersistentVolumeClaim>(cluster);
        if keep_data {
            let kept = pvcs
                .list(&params)
                .await
                .map_err(kube_error("list member PersistentVolumeClaims"))?;
            for pvc in kept.items {
                let member = pvc
                    .labels()
                    .get(MEMBER_LABEL)
                    .or_else(|| pvc.labels().get(REMOVED_MEMBER_LABEL))
                    .cloned()
                    .unwrap_or_default();
                ignore_not_found(
                    pvcs.patch(
                        &pvc.name_any(),
                        &crate::resources::patch_params(),
                        &Patch::Merge(&release_patch(cluster, &member)),
                    )
                    .await,
                    "release a member PersistentVolumeClaim",
                )?;
            }
        } else {
            pvcs.delete_collection(&DeleteParams::default(), &params)
                .await
                .map_err(kube_error("delete the member PersistentVolumeClaims"))?;
        }
        let services = self.api::<Service>(cluster);
        ignore_not_found(
            services
                .delete(
                    &naming::peer_service_name(&cluster.name),
                    &DeleteParams::default(),
                )
                .await,
            "delete the peer Service",
        )?;
        ignore_not_found(
            services
                .delete(
                    &naming::client_service_name(&cluster.name),
                    &DeleteParams::default(),
                )
                .await,
            "delete the client Service",
        )?;
        ignore_not_found(
            self.api::<PodDisruptionBudget>(cluster)
                .delete(&naming::pdb_name(&cluster.name), &DeleteParams::default())
                .await,
            "delete the PodDisruptionBudget",
        )?;
        self.with_memory(cluster, BTreeMap::clear);
        // The CA and member Secrets and cert-manager Certificates are owned by the EtcdCluster:
        // the garbage collector removes them with it. The operator's identity goes now.
        self.identities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&cluster.key());
        info!(cluster = %cluster.key(), keep_data, "tore down the cluster's Pods, volume claims, Services and PodDisruptionBudget");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_set_aside_claims_are_kept() {
        let claim = |name: &str, at: Option<&str>, deleting: bool| -> PersistentVolumeClaim {
            let mut meta = json!({"name": name, "annotations": {}});
            if let Some(at) = at {
                meta["annotations"][REMOVED_AT_ANNOTATION] = json!(at);
            }
            if deleting {
                meta["deletionTimestamp"] = json!("2026-11-25T10:00:00Z");
            }
            serde_json::from_value(json!({ "metadata": meta })).unwrap()
        };
        let claims = vec![
            claim("a-data", Some("2026-11-25T10:00:00.000Z"), false),
            claim("b-data", Some("2026-11-25T12:00:00.000Z"), false),
            claim("c-data", None, false),
            claim("d-data", Some("2026-11-25T11:00:00.000+01:00"), false), // 10:00Z, as a
            claim("e-data", Some("2026-11-25T13:00:00.000Z"), false),
            claim("f-data", Some("2026-11-25T14:00:00.000Z"), true),
        ];
        // Newest b, e and one of a/d (same instant: by name, a); c has no time: oldest. f is
        // already going and neither counts nor is deleted again.
        assert_eq!(set_aside_to_prune(&claims, 3), vec!["d-data", "c-data"]);
        assert_eq!(set_aside_to_prune(&claims, 5), Vec::<String>::new());
        assert_eq!(set_aside_to_prune(&claims, 0).len(), 5);
        // The patch: no longer the member's, still the cluster's (labels and owners untouched).
        assert_eq!(
            set_aside_patch("m1", "2026-11-25T10:00:00.000Z"),
            json!({"metadata": {
                "labels": {"etcd.operator.dev/member": null, "etcd.operator.dev/removed-member": "m1"},
                "annotations": {"etcd.operator.dev/removed-at": "2026-11-25T10:00:00.000Z"}
            }})
        );
    }

    fn pod_with_init(statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "m"},
            "status": {"phase": "Pending", "initContainerStatuses": statuses}
        }))
        .unwrap()
    }

    #[test]
    fn failed_restore_reads_the_current_or_last_failure_only() {
        let status = |state: serde_json::Value, last: serde_json::Value| {
            json!([{"name": "restore", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
                    "state": state, "lastState": last}])
        };
        // Terminated now without a message: the exit code.
        let pod = pod_with_init(status(json!({"terminated": {"exitCode": 2}}), json!({})));
        assert_eq!(
            failed_restore(&pod).unwrap().to_string(),
            "init container restore of the member Pod failed: exit code 2"
        );
        // Running again after a failure: not (yet) a failure.
        let pod = pod_with_init(status(
            json!({"running": {}}),
            json!({"terminated": {"exitCode": 1, "message": "x"}}),
        ));
        assert!(failed_restore(&pod).is_none());
        // Not creatable (the credentials Secret is missing): reported with the kubelet's message.
        let pod = pod_with_init(status(
            json!({"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"s3-keys\" not found"}}),
            json!({}),
        ));
        assert_eq!(
            failed_restore(&pod).unwrap().to_string(),
            "init container restore of the member Pod failed: it cannot be created: secret \"s3-keys\" not found"
        );
        // Waiting for its image: not a failure.
        let pod = pod_with_init(status(
            json!({"waiting": {"reason": "ContainerCreating"}}),
            json!({}),
        ));
        assert!(failed_restore(&pod).is_none());
        // No init containers at all.
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "m"}})).unwrap();
        assert!(failed_restore(&pod).is_none());
    }
}
