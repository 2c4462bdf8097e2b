//! Where members run. The reconcile logic is shared; a `Runtime` only places, starts, observes
//! and removes members: `local` (etcd processes on loopback) and `kubernetes` (Pods and PVCs).
//! Each call reads the [`ValidatedCluster`] (never the raw spec), does its part of one step and
//! returns: what takes time (a Pod stopping, a certificate being issued) is
//! [`RuntimeError::Waiting`] and the next reconcile goes on. Every call is idempotent.

pub mod events;
pub mod fake;
pub mod kubernetes;
pub mod local;

use std::future::Future;

use crate::model::{ClusterRef, MemberConfig, RuntimeMember};

/// The reason of the Warning Event announcing a member's replacement.
pub const MEMBER_REPLACING_REASON: &str = "MemberReplacing";

/// The resolved cluster every runtime call reads (image, storage, pod settings, TLS planes).
pub use crate::validated::ValidatedCluster;

/// A runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The etcd version asked for cannot run here (no binary, no image).
    #[error("etcd {version} is not available: {detail}")]
    VersionUnavailable {
        /// The version.
        version: String,
        /// What is missing and how to get it.
        detail: String,
    },
    /// A member named in a call is unknown to the runtime.
    #[error("member {name} is not known to the runtime")]
    UnknownMember {
        /// The member.
        name: String,
    },
    /// File or process work failed (local runtime).
    #[error("{op} for member {member}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The member.
        member: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A Kubernetes API call failed (kubernetes runtime).
    #[error("{op}")]
    Kube {
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A member's data could not be restored from its snapshot (fetch, checksum, restore tool).
    #[error("restore from snapshot for member {member}")]
    Restore {
        /// The member.
        member: String,
        /// The cause.
        #[source]
        source: Box<crate::restore::RestoreError>,
    },
    /// The TLS provider the spec asks for is not available in this runtime.
    #[error(
        "spec.tls.{plane}.{provider} is not supported by the {runtime} runtime yet; the cluster is not started without the TLS it asks for"
    )]
    TlsUnsupported {
        /// `client` or `peer`.
        plane: &'static str,
        /// `auto`, `secretRef` or `certManager`.
        provider: &'static str,
        /// `local` or `kubernetes`.
        runtime: &'static str,
    },
    /// The certificates of a cluster could not be made, read or written.
    #[error("certificates of {what}: {detail}")]
    Certificates {
        /// Which certificates.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// A Secret the cluster's TLS needs (a `secretRef` Secret, a cert-manager Certificate's
    /// Secret) is missing or unusable: the members are not started without it.
    #[error(
        "spec.tls.{plane}.{provider}: Secret {secret} {detail}; the cluster's members are not started without their certificates"
    )]
    TlsSecret {
        /// `client` or `peer`.
        plane: &'static str,
        /// `secretRef` or `certManager`.
        provider: &'static str,
        /// `namespace/name` of the Secret.
        secret: String,
        /// What is wrong (`does not exist`, `has no tls.key`, ...).
        detail: String,
    },
    /// cert-manager has not issued a Certificate yet: its Secret does not exist (or holds no
    /// certificate) yet. Waiting, not a fault, unless it lasts.
    #[error("waiting for cert-manager to issue Certificate {certificate} into Secret {secret}")]
    CertificateNotReady {
        /// `namespace/name` of the Certificate.
        certificate: String,
        /// `namespace/name` of its Secret.
        secret: String,
    },
    /// The operation is not available in this runtime (yet).
    #[error("{operation} is not available in the {runtime} runtime yet")]
    Unsupported {
        /// What was asked.
        operation: &'static str,
        /// `local` or `kubernetes`.
        runtime: &'static str,
    },
    /// An operation goes on in the next call: something it started takes time (a Pod
    /// stopping, a member starting). Waiting, not a fault, unless it lasts.
    #[error("member {member}: waiting: {detail}")]
    Waiting {
        /// The member.
        member: String,
        /// What is waited for.
        detail: String,
    },
    /// A member's volume cannot grow: its StorageClass does not allow expansion.
    #[error(
        "PersistentVolumeClaim {claim} cannot grow: {}; spec.storage.size is kept as it was on the running members",
        if *found { format!("its StorageClass {class} does not set allowVolumeExpansion: true") } else { format!("its StorageClass {class} was not found") }
    )]
    VolumeExpansionNotAllowed {
        /// `namespace/name` of the claim.
        claim: String,
        /// Its StorageClass.
        class: String,
        /// Whether the class exists.
        found: bool,
    },
    /// Stored member state could not be read or written.
    #[error("member state of {member}: {detail}")]
    State {
        /// The member.
        member: String,
        /// What is wrong.
        detail: String,
    },
}

/// How many removed members' data each cluster keeps set aside (the newest by removal time).
pub const RETAINED_REMOVED_LIMIT: usize = 3;

/// Places and runs etcd members. Every operation is idempotent, so a reconcile that is
/// interrupted at any point can simply run again.
pub trait Runtime: Send + Sync + 'static {
    /// Every member the runtime holds for the cluster (reserved, running or gone).
    fn members(
        &self,
        cluster: &ClusterRef,
    ) -> impl Future<Output = Result<Vec<RuntimeMember>, RuntimeError>> + Send;

    /// Reserves a member: its addresses and storage, persisted, not started. Calling it again for
    /// the same name returns the same member.
    fn reserve(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> impl Future<Output = Result<RuntimeMember, RuntimeError>> + Send;

    /// Records the start configuration (once; a member keeps its first configuration) and starts
    /// the member if it does not run. The member must have been reserved.
    fn start(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        config: &MemberConfig,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Changes the member's version with its data kept: records `version` as its configured
    /// version (the old one as `previous_version`), stops it, and starts it again on `version`.
    /// Idempotent: called again with the same version it only makes sure the member runs.
    /// A version that cannot run here is [`RuntimeError::VersionUnavailable`], before anything
    /// changes.
    fn change_version(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        version: &str,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Issues the member's certificates again (under `spec.certificate_rotation`, which the
    /// member reports back in [`crate::model::MemberCertificates::rotation`]) and restarts it on
    /// them with its data kept. Idempotent: certificates that are still good for the renewal
    /// window and carry the asked rotation are kept, and the call only makes sure the member runs.
    fn renew_certificates(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// The rotation of the cluster's `auto` CAs (see [`crate::tls::authority`]): its phase, the
    /// rotation value recorded when the last one began and how long the issuing CAs stay valid.
    /// `None` without an `auto` plane, or before its CAs exist (they are made with the first
    /// member's certificates).
    fn authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> impl Future<Output = Result<Option<crate::tls::authority::AuthorityView>, RuntimeError>> + Send;

    /// Moves every `auto` plane's CA rotation to `to` (a plane already there is left alone):
    /// begin (a new CA made and trusted beside the issuing one, `rotation` recorded), swap (the
    /// new CA issues, the old one stays trusted) or finish (the old CA is dropped). Writes only
    /// the CAs: the members roll through [`Runtime::renew_certificates`], and the operator's own
    /// identity follows on its next use. A move the rotation cannot make from where it is is an
    /// error that changes nothing.
    fn advance_authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        to: crate::tls::authority::AuthorityPhase,
        rotation: Option<&str>,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// The hash of the member template `spec` renders to in this runtime (see
    /// [`crate::template`]): what a member reports in [`RuntimeMember::template_hash`] once it
    /// was created from this spec. `None`: this runtime does not roll members onto templates.
    fn template_hash(&self, cluster: &ClusterRef, spec: &ValidatedCluster) -> Option<String>;

    /// Re-creates a running member on the member template `spec` renders to, its data and
    /// configuration kept: stops it and starts it again from `spec` (Kubernetes: deletes its Pod,
    /// which the next start creates anew on its volume). Never waits: a member still stopping is
    /// [`RuntimeError::Waiting`], and a later call (or start) carries on. Idempotent: a member
    /// already on the template is left alone.
    fn recreate(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Grows the member's volume to `spec.volume_bytes` (Kubernetes: its claim's request, when
    /// its StorageClass allows expansion, else [`RuntimeError::VolumeExpansionNotAllowed`]).
    /// Idempotent. A runtime without member volumes does nothing.
    fn expand_volume(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Rebuilds a cluster that lost quorum from `survivor`: stops every member, removes every
    /// other member with its data, and starts the survivor once with `--force-new-cluster` (a
    /// one-member cluster with its data; the controller adds members back as for a scale-up).
    /// Idempotent: called again it ends in the same state.
    fn recover_quorum(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        survivor: &str,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Stops the member and keeps its data and configuration (it is `Gone`, restartable).
    fn stop(&self, cluster: &ClusterRef, name: &str)
    -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// A directory beside the cluster's data where the operator may keep files for it (the
    /// pre-upgrade snapshot), or `None` when the runtime has no such place reachable from the
    /// operator (Kubernetes: the data lives in volumes mounted only by the member Pods).
    fn snapshot_dir(&self, cluster: &ClusterRef) -> Option<std::path::PathBuf>;

    /// Tells people that `member` is about to be replaced (or, with `policy: Manual`, needs
    /// replacing): a Warning Event with reason [`MEMBER_REPLACING_REASON`] where the runtime has
    /// Events (Kubernetes, and local mode when its API serves them), a warning in the operator's
    /// log otherwise. Best effort: a failure is logged, never returned.
    fn announce_replacement(
        &self,
        cluster: &ClusterRef,
        member: &str,
        note: &str,
    ) -> impl Future<Output = ()> + Send;

    /// Reports a problem with the cluster to people: a Warning Event on the EtcdCluster with
    /// `reason` (a stable code) and `action` (what was being done) where the runtime has Events
    /// (Kubernetes, and local mode when its API serves them), a warning in the operator's log
    /// otherwise. Best effort: a failure is logged, never returned.
    fn warn(
        &self,
        cluster: &ClusterRef,
        reason: &str,
        action: &str,
        note: &str,
    ) -> impl Future<Output = ()> + Send;

    /// Stops the member and removes it. Its data is kept (released from the cluster) when
    /// `keep_data`; otherwise it is given up but set aside, and only the newest
    /// [`RETAINED_REMOVED_LIMIT`] of the cluster's set-aside members are kept (a member removed
    /// by mistake can still be looked at; repeated replacements do not fill the disk): the local
    /// runtime moves the data directory under `<cluster>/.retained/removed/`, the Kubernetes
    /// runtime relabels the volume claim as a removed member's (still owned by the cluster, so it
    /// goes with it).
    fn remove(
        &self,
        cluster: &ClusterRef,
        name: &str,
        keep_data: bool,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Removes every member of the cluster and what the runtime created for it.
    fn teardown(
        &self,
        cluster: &ClusterRef,
        keep_data: bool,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// The operator's identity toward the cluster's members when their client plane uses TLS
    /// (`None`: plain HTTP), creating it when the runtime issues the certificates itself.
    fn client_tls(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> impl Future<Output = Result<Option<crate::tls::member::ClientTls>, RuntimeError>> + Send;

    /// Makes the controller watch what this runtime creates for a cluster, so a change to a
    /// member (a Pod deleted, failing or turning ready) triggers its reconcile at once. A runtime
    /// whose members send no events returns the controller as it is and relies on
    /// [`resync_interval`](Runtime::resync_interval).
    fn watch_children(
        &self,
        controller: kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>,
    ) -> kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>;

    /// How often a settled cluster is looked at anyway: this bounds how long a change nothing
    /// reports (a member process that died, etcd turning unhealthy) goes unnoticed.
    fn resync_interval(&self) -> std::time::Duration;
}
