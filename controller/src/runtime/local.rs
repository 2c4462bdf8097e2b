//! The local runtime: each member is a real etcd process on loopback ports with its own data
//! directory under the state directory. Members run in their own process group, so they outlive
//! a restart (or crash) of the operator the way Pods do, and are re-adopted from their pid files.
//!
//! Layout: `<root>/<namespace>/<cluster>/<member>/{member.json, data/, etcd.log, etcd.pid}`,
//! `<root>/<namespace>/<cluster>/snapshots/` for snapshots taken before an upgrade, and for a
//! cluster with `spec.tls` (`auto`): `<cluster>/pki/{client-ca,peer-ca,operator}.{crt,key}` and
//! each member's `<member>/tls/{server,peer}.{crt,key}` (keys 0600).

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::events::{LocalEvents, Report};
use super::{RETAINED_REMOVED_LIMIT, Runtime, RuntimeError, ValidatedCluster};
use crate::etcd_args::TlsFiles;
use crate::model::{ClusterRef, Liveness, MemberConfig, RuntimeMember};
use crate::tls::authority::{Authority, AuthorityPhase, AuthorityView};
use crate::tls::ca::{CertificateError, PemPair, RENEW_BEFORE};
use crate::tls::member::{self as member_tls, ClientTls, Provider, TlsPlanes};
use etcd_operator_api::report::chain;

mod authority;
mod exits;

const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// What is persisted for each member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemberFile {
    name: String,
    peer_port: u16,
    client_port: u16,
    #[serde(default)]
    config: Option<MemberConfig>,
    /// Set once the process was started for the first time.
    #[serde(default)]
    started: bool,
    /// The client plane serves HTTPS with a certificate of the cluster's client CA.
    #[serde(default)]
    client_tls: bool,
    /// The peer plane uses mutual TLS with certificates of the cluster's peer CA.
    #[serde(default)]
    peer_tls: bool,
    /// The port the member's peer URL advertises when it is not `peer_port`: a forwarder (a
    /// fault-injecting proxy in tests) listens there and passes on to `peer_port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    advertise_peer_port: Option<u16>,
    /// When the member was reserved, in nanoseconds since the epoch (absent in files written
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reserved_at_ns: Option<i64>,
    /// Whether the runtime marks the member's first data ([`DATA_SEEN_MARKER`]): false in files
    /// written before it did, whose members are taken to have had data.
    #[serde(default)]
    marks_data: bool,
}

/// A file beside `data/` (so that it outlives the data), made the first time the member is seen
/// running with its data directory: a member that exited with no data directory and no marker
/// never had data (its first start failed before etcd made it, e.g. a port taken under load),
/// and is started again; with the marker its data is gone, and it must be replaced.
const DATA_SEEN_MARKER: &str = "data-seen";

impl MemberFile {
    fn client_url(&self) -> String {
        let scheme = if self.client_tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The peer URL the member advertises (and its peers dial).
    fn peer_url(&self) -> String {
        let scheme = if self.peer_tls { "https" } else { "http" };
        format!(
            "{scheme}://127.0.0.1:{}",
            self.advertise_peer_port.unwrap_or(self.peer_port)
        )
    }

    /// The peer URL the member listens on.
    fn listen_peer_url(&self) -> String {
        let scheme = if self.peer_tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.peer_port)
    }
}

/// The certificate files of a member's planes that use TLS.
#[derive(Debug, Default)]
struct MemberTlsFiles {
    client: Option<TlsFiles>,
    peer: Option<TlsFiles>,
}

/// The TLS planes of `spec`, refused unless each uses a provider this runtime has (`auto`).
fn local_planes(spec: &ValidatedCluster) -> Result<TlsPlanes, RuntimeError> {
    let planes = spec.tls.clone();
    for (plane, provider) in [("client", &planes.client), ("peer", &planes.peer)] {
        if let Some(provider) = provider
            && *provider != Provider::Auto
        {
            return Err(RuntimeError::TlsUnsupported {
                plane,
                provider: provider.field(),
                runtime: "local",
            });
        }
    }
    Ok(planes)
}

fn certificates_error(what: &str) -> impl FnOnce(String) -> RuntimeError + '_ {
    move |detail| RuntimeError::Certificates {
        what: what.to_owned(),
        detail,
    }
}

/// Reads `<base>.crt` and `<base>.key`; issues and writes them with `issue` when either is
/// missing, when the key is not the certificate's, or when `still_good` refuses the certificate
/// (expired or expiring within [`RENEW_BEFORE`], or not from the CA any more). The key is written
/// first, 0600, so a crash in between only causes another re-issue.
fn ensure_pair(
    base: &Path,
    still_good: impl FnOnce(&PemPair) -> Result<(), Reissue>,
    issue: impl FnOnce() -> Result<PemPair, CertificateError>,
) -> Result<PemPair, RuntimeError> {
    let what = base.display().to_string();
    let cert_path = base.with_extension("crt");
    let key_path = base.with_extension("key");
    if let (Ok(cert_pem), Ok(key_pem)) = (
        std::fs::read_to_string(&cert_path),
        std::fs::read_to_string(&key_path),
    ) {
        let pair = PemPair { cert_pem, key_pem };
        let checked = if pair_matches(&pair) {
            still_good(&pair)
        } else {
            Err(Reissue::KeyMismatch)
        };
        match checked {
            Ok(()) => return Ok(pair),
            Err(reason) => {
                tracing::info!(certificate = %what, reason = %chain(&reason), "issuing the certificate again")
            }
        }
    }
    let pair = issue().map_err(|e| certificates_error(&what)(chain(&e)))?;
    if let Some(dir) = base.parent() {
        std::fs::create_dir_all(dir).map_err(|e| certificates_error(&what)(e.to_string()))?;
    }
    write_file(&key_path, &pair.key_pem, 0o600).map_err(|e| certificates_error(&what)(e.to_string()))?;
    write_file(&cert_path, &pair.cert_pem, 0o644).map_err(|e| certificates_error(&what)(e.to_string()))?;
    Ok(pair)
}

/// Why a stored certificate is issued again.
#[derive(Debug, thiserror::Error)]
enum Reissue {
    /// Its key is not its certificate's.
    #[error("its key does not belong to it")]
    KeyMismatch,
    /// An on-demand rotation asks for new certificates.
    #[error("rotation {0:?} was requested")]
    Rotation(String),
    /// It does not pass the CA's checks.
    #[error("the certificate is no longer good")]
    Check(#[from] crate::tls::ca::CheckError),
}

/// Whether the pair's key is its certificate's key.
fn pair_matches(pair: &PemPair) -> bool {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pair.cert_pem.as_bytes())
        .is_ok_and(|cert| crate::tls::ca::key_matches_certificate(&cert, &pair.key_pem))
}

/// The names a member's serving certificate must be valid for, as rustls checks them.
fn server_names(member: &str) -> Vec<rustls_pki_types::ServerName<'static>> {
    let (dns, ips) = member_tls::member_names(&[member.to_owned()]);
    dns.into_iter()
        .filter_map(|d| rustls_pki_types::ServerName::try_from(d).ok())
        .chain(
            ips.into_iter()
                .map(|ip| rustls_pki_types::ServerName::IpAddress(ip.into())),
        )
        .collect()
}

/// Writes `contents` to `path` with `mode` from the first byte (through a temporary sibling,
/// renamed into place).
fn write_file(path: &Path, contents: &str, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Runs members as local etcd processes.
#[derive(Debug, Clone)]
pub struct LocalRuntime {
    root: PathBuf,
    /// Directory holding `<version>/etcd` binaries (the project's `.tools/etcd`).
    binaries: PathBuf,
    /// How snapshots to restore from are fetched (S3 keys from the environment or a file).
    restore_credentials: crate::backup::Credentials,
    /// The processes asked to stop, by pid, with when they were first sent SIGTERM (past
    /// [`STOP_TIMEOUT`] they get SIGKILL).
    stopping: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, std::time::Instant>>>,
    /// New members advertise a peer port of their own, for a forwarder to listen on.
    separate_advertised_peer_port: bool,
    /// Where Events go (the local API server); `None`: to the log only.
    events: Option<std::sync::Arc<LocalEvents>>,
    /// Member processes that exit, told to the controller.
    exits: std::sync::Arc<exits::Exits>,
}

fn io<'a>(op: &'static str, member: &'a str) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Io {
        op,
        member: member.to_string(),
        source,
    }
}

impl LocalRuntime {
    /// A runtime keeping members under `root`, running binaries from `binaries/<version>/etcd`.
    pub fn new(root: impl Into<PathBuf>, binaries: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            binaries: binaries.into(),
            restore_credentials: crate::backup::Credentials::Environment { file: None },
            stopping: std::sync::Arc::default(),
            separate_advertised_peer_port: false,
            events: None,
            exits: std::sync::Arc::default(),
        }
    }

    /// Also writes its Events as core Events through `client` (the loopback client of local
    /// mode, whose server serves them), as the Kubernetes runtime does to kube-apiserver.
    pub fn with_events(mut self, client: kube::Client) -> Self {
        self.events = Some(std::sync::Arc::new(LocalEvents::new(client)));
        self
    }

    /// Writes `report` about `cluster` as an Event when Events are on; best effort (a failure
    /// is logged).
    async fn record(&self, cluster: &ClusterRef, report: Report) {
        if let Some(events) = &self.events
            && let Err(error) = events.record(cluster, &report).await
        {
            tracing::warn!(cluster = %cluster.key(), error = %chain(&error), reason = %report.reason, "could not record an Event");
        }
    }

    /// [`Runtime::remove`] without the Event: what became of the member's data (for the Event's
    /// note), or `None` when there was no member.
    fn remove_member(
        &self,
        cluster: &ClusterRef,
        name: &str,
        keep_data: bool,
    ) -> Result<Option<String>, RuntimeError> {
        let dir = self.member_dir(cluster, name);
        if !dir.exists() {
            return Ok(None);
        }
        self.stop_process(&dir, name)?;
        let retained = self.cluster_dir(cluster).join(".retained");
        if keep_data {
            std::fs::create_dir_all(&retained).map_err(io("retain member data", name))?;
            std::fs::rename(&dir, unused_path(&retained, name)).map_err(io("retain member data", name))?;
            return Ok(Some(", kept its data directory".to_owned()));
        }
        if !dir.join("data").exists() {
            std::fs::remove_dir_all(&dir).map_err(io("delete member directory", name))?;
            return Ok(Some(String::new()));
        }
        let removed = retained.join("removed");
        std::fs::create_dir_all(&removed).map_err(io("set member data aside", name))?;
        let target = unused_path(&removed, name);
        std::fs::rename(&dir, &target).map_err(io("set member data aside", name))?;
        // The move keeps the directory's own times: stamp it so pruning goes by removal time.
        std::fs::File::open(&target)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()))
            .map_err(io("set member data aside", name))?;
        tracing::info!(cluster = %cluster.key(), member = %name, path = %target.display(), "set the removed member's data aside");
        prune_removed(&removed, RETAINED_REMOVED_LIMIT).map_err(io("prune set-aside member data", name))?;
        Ok(Some(format!(
            ", set its data directory aside (the newest {RETAINED_REMOVED_LIMIT} removed members' data stay until the cluster is deleted)"
        )))
    }

    /// Gives each new member a second peer port that its peer URL advertises, recorded as
    /// `advertisePeerPort` in its `member.json`, while it listens on `peerPort`. Nothing forwards
    /// one to the other: for fault-injection tests, which put a proxy there (until one does, the
    /// member's peers cannot reach it).
    pub fn with_separate_advertised_peer_ports(mut self) -> Self {
        self.separate_advertised_peer_port = true;
        self
    }

    /// Fetches snapshots to restore from with these credentials (default: the environment).
    pub fn with_restore_credentials(mut self, credentials: crate::backup::Credentials) -> Self {
        self.restore_credentials = credentials;
        self
    }

    fn cluster_dir(&self, cluster: &ClusterRef) -> PathBuf {
        self.root.join(&cluster.namespace).join(&cluster.name)
    }

    fn member_dir(&self, cluster: &ClusterRef, name: &str) -> PathBuf {
        self.cluster_dir(cluster).join(name)
    }

    /// The CA files of one plane (`client` or `peer`) of the cluster.
    fn plane_cas(&self, cluster: &ClusterRef, plane: &'static str) -> authority::PlaneCas {
        authority::PlaneCas::new(self.cluster_dir(cluster).join("pki"), plane, &cluster.key())
    }

    /// The cluster's CAs of one plane, created on first use (a CA is never replaced silently:
    /// members trust it until they restart; a new one comes only through a rotation).
    fn ensure_authority(&self, cluster: &ClusterRef, plane: &'static str) -> Result<Authority, RuntimeError> {
        Ok(self.plane_cas(cluster, plane).load()?.0)
    }

    /// A member's certificates for the planes that use TLS: `<member>/tls/{server,peer}`, and
    /// the plane's trust bundle (`<member>/tls/<plane>-trust.crt`). Certificates issued under another on-demand rotation
    /// than `rotation` (when one is asked for) are issued again, and `rotation` is recorded
    /// beside them (`<member>/tls/rotation`) once they are written.
    fn ensure_member_certificates(
        &self,
        cluster: &ClusterRef,
        file: &MemberFile,
        rotation: Option<&str>,
    ) -> Result<MemberTlsFiles, RuntimeError> {
        let dir = self.member_dir(cluster, &file.name).join("tls");
        let names = [file.name.clone()];
        let server_names = server_names(&file.name);
        let now = std::time::SystemTime::now();
        let mut files = MemberTlsFiles::default();
        let rotation_file = dir.join("rotation");
        let recorded = std::fs::read_to_string(&rotation_file).ok();
        let rotate = rotation.is_some_and(|r| recorded.as_deref() != Some(r));
        let requested = |pair: &PemPair, check: &dyn Fn(&PemPair) -> Result<(), Reissue>| {
            if rotate {
                return Err(Reissue::Rotation(rotation.unwrap_or_default().to_owned()));
            }
            check(pair)
        };
        // The member trusts its own copy of the plane's bundle, written as it starts: what the
        // copy says is what the running process trusts (a CA rotation compares it).
        let trust = |plane: &str, authority: &Authority| {
            let path = dir.join(format!("{plane}-trust.crt"));
            write_file(&path, &authority.bundle(), 0o644)
                .map_err(|e| certificates_error(&path.display().to_string())(e.to_string()))?;
            Ok::<_, RuntimeError>(path.display().to_string())
        };
        if file.client_tls {
            let authority = self.ensure_authority(cluster, "client")?;
            let ca = &authority.issuing;
            let good = |pair: &PemPair| {
                requested(pair, &|p: &PemPair| {
                    Ok(ca.verify_server(&p.cert_pem, &server_names, now)?)
                })
            };
            ensure_pair(&dir.join("server"), good, || {
                ca.issue(&member_tls::server_certificate(&file.name, &names))
            })?;
            files.client = Some(TlsFiles {
                cert: dir.join("server.crt").display().to_string(),
                key: dir.join("server.key").display().to_string(),
                trusted_ca: trust("client", &authority)?,
            });
        }
        if file.peer_tls {
            let authority = self.ensure_authority(cluster, "peer")?;
            let ca = &authority.issuing;
            let good = |pair: &PemPair| {
                requested(pair, &|p: &PemPair| {
                    ca.verify_server(&p.cert_pem, &server_names, now)?;
                    Ok(ca.verify_client(&p.cert_pem, now)?)
                })
            };
            ensure_pair(&dir.join("peer"), good, || {
                ca.issue(&member_tls::peer_certificate(&file.name, &names))
            })?;
            files.peer = Some(TlsFiles {
                cert: dir.join("peer.crt").display().to_string(),
                key: dir.join("peer.key").display().to_string(),
                trusted_ca: trust("peer", &authority)?,
            });
        }
        if let Some(rotation) = rotation.filter(|_| rotate && (file.client_tls || file.peer_tls)) {
            write_file(&rotation_file, rotation, 0o644)
                .map_err(|e| certificates_error(&rotation_file.display().to_string())(e.to_string()))?;
        }
        Ok(files)
    }

    /// What the member's certificates on disk say: the earliest expiry, the rotation they
    /// were issued under, and whether it runs on what the CA rotation asks (`None` for a member
    /// without TLS or not issued yet).
    fn member_certificates(
        &self,
        cluster: &ClusterRef,
        dir: &Path,
        file: &MemberFile,
    ) -> Option<crate::model::MemberCertificates> {
        let tls = dir.join("tls");
        let planes = [
            (file.client_tls, "server.crt", "client"),
            (file.peer_tls, "peer.crt", "peer"),
        ];
        let mut earliest: Option<std::time::SystemTime> = None;
        let mut lag = None;
        for (_, cert, plane) in planes.iter().filter(|(on, _, _)| *on) {
            let pem = std::fs::read_to_string(tls.join(cert)).ok()?;
            // An unreadable certificate counts as expired: renewing it is the remedy.
            let at = crate::tls::ca::not_after(&pem).unwrap_or(std::time::SystemTime::UNIX_EPOCH);
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
            if let Ok((authority, _)) = self.plane_cas(cluster, plane).load() {
                // A member started before trust files were written trusts the issuing CA's file.
                let trusted = std::fs::read_to_string(tls.join(format!("{plane}-trust.crt")))
                    .unwrap_or_else(|_| authority.issuing.pem().cert_pem.clone());
                lag = lag.or(authority.lag(&trusted, &pem));
            }
        }
        let valid_for = earliest?
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        Some(crate::model::MemberCertificates {
            valid_for,
            rotation: std::fs::read_to_string(tls.join("rotation")).ok(),
            authority: lag,
        })
    }

    /// The etcd binary of a version, or why it cannot run here.
    pub fn binary(&self, version: &str) -> Result<PathBuf, RuntimeError> {
        let path = self.binaries.join(version).join("etcd");
        if path.is_file() {
            return Ok(path);
        }
        let mut installed: Vec<String> = std::fs::read_dir(&self.binaries)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|v| !v.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        installed.sort();
        Err(RuntimeError::VersionUnavailable {
            version: version.to_string(),
            detail: format!(
                "no etcd binary at {} (installed: {}); the local runtime runs only installed versions (`make tools-etcd`)",
                path.display(),
                if installed.is_empty() {
                    "none".to_string()
                } else {
                    installed.join(", ")
                }
            ),
        })
    }

    /// A member that was started once: its directory, its file and its configuration;
    /// [`RuntimeError::UnknownMember`] when there is none, [`RuntimeError::State`] saying
    /// `never_started` when it has no configuration yet.
    fn started_member(
        &self,
        cluster: &ClusterRef,
        name: &str,
        never_started: &str,
    ) -> Result<(PathBuf, MemberFile, MemberConfig), RuntimeError> {
        let dir = self.member_dir(cluster, name);
        if !dir.join("member.json").is_file() {
            return Err(RuntimeError::UnknownMember {
                name: name.to_string(),
            });
        }
        let file = self.read_member(&dir, name)?;
        let Some(config) = file.config.clone() else {
            return Err(RuntimeError::State {
                member: name.to_string(),
                detail: never_started.to_owned(),
            });
        };
        Ok((dir, file, config))
    }

    fn read_member(&self, dir: &Path, name: &str) -> Result<MemberFile, RuntimeError> {
        let text = std::fs::read_to_string(dir.join("member.json")).map_err(io("read member.json", name))?;
        serde_json::from_str(&text).map_err(|e| RuntimeError::State {
            member: name.to_string(),
            detail: e.to_string(),
        })
    }

    fn write_member(&self, dir: &Path, file: &MemberFile) -> Result<(), RuntimeError> {
        let text = serde_json::to_string_pretty(file).map_err(|e| RuntimeError::State {
            member: file.name.clone(),
            detail: e.to_string(),
        })?;
        // Write then rename: a crash never leaves a half-written member.json.
        let tmp = dir.join("member.json.tmp");
        std::fs::write(&tmp, text).map_err(io("write member.json", &file.name))?;
        std::fs::rename(&tmp, dir.join("member.json")).map_err(io("write member.json", &file.name))
    }

    fn to_runtime_member(&self, cluster: &ClusterRef, dir: &Path, file: &MemberFile) -> RuntimeMember {
        let stale = stale_version(dir, file);
        let liveness = if !file.started {
            Liveness::Reserved
        } else if let Some((running, configured)) = stale {
            // Recorded on a new version, but the operator stopped before the restart: what runs
            // is not the member as configured, so it counts as stopped and is started again.
            Liveness::Gone {
                reason: format!(
                    "its process still runs etcd {running} while it is configured for {configured}"
                ),
                restartable: true,
            }
        } else if let Some(pid) = running_pid(dir) {
            if let Some((_, start)) = proc_state(pid) {
                self.exits.adopted(cluster, pid, start);
            }
            mark_data_seen(dir, file);
            Liveness::Running
        } else if !has_wal(dir) {
            if file.marks_data && !dir.join(DATA_SEEN_MARKER).exists() {
                Liveness::Gone {
                    reason: "its first start exited before etcd made its data directory".into(),
                    restartable: true,
                }
            } else if dir.join("data").exists() {
                // What etcd leaves when it starts on an emptied data directory as a member the
                // cluster already has ("has already been bootstrapped"): a database and no log.
                // Starting it again only repeats that.
                Liveness::Gone {
                    reason:
                        "the process exited and its data directory holds no write-ahead log: its data is gone"
                            .into(),
                    restartable: false,
                }
            } else {
                Liveness::Gone {
                    reason: "the process exited and its data directory is gone".into(),
                    restartable: false,
                }
            }
        } else {
            Liveness::Gone {
                reason: "the process exited".into(),
                restartable: true,
            }
        };
        RuntimeMember {
            name: file.name.clone(),
            peer_url: file.peer_url(),
            client_url: file.client_url(),
            config: file.config.clone(),
            liveness,
            certificates: self.member_certificates(cluster, dir, file),
            restarts: 0,
            template_hash: running_template(dir),
            volume: None,
            created: file.reserved_at_ns.map(chrono::DateTime::from_timestamp_nanos),
        }
    }

    /// Starts the member's process ([`Self::spawn`]) and records that it has been started.
    fn launch(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        dir: &Path,
        file: &mut MemberFile,
        config: &MemberConfig,
        force_new_cluster: bool,
    ) -> Result<(), RuntimeError> {
        self.spawn(cluster, spec, dir, file, config, force_new_cluster)?;
        file.started = true;
        self.write_member(dir, file)
    }

    fn spawn(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        dir: &Path,
        file: &MemberFile,
        config: &MemberConfig,
        force_new_cluster: bool,
    ) -> Result<(), RuntimeError> {
        let binary = self.binary(&config.version)?;
        let tls = self.ensure_member_certificates(cluster, file, spec.certificate_rotation.as_deref())?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("etcd.log"))
            .map_err(io("open etcd.log", &file.name))?;
        let err = log.try_clone().map_err(io("open etcd.log", &file.name))?;
        let client = file.client_url();
        let launch = crate::etcd_args::MemberLaunch {
            name: &file.name,
            config,
            data_dir: dir.join("data").display().to_string(),
            listen_peer_url: file.listen_peer_url(),
            advertise_peer_url: file.peer_url(),
            listen_client_url: client.clone(),
            advertise_client_url: client,
            listen_metrics_url: None,
            client_tls: tls.client,
            peer_tls: tls.peer,
            force_new_cluster,
        };
        let mut cmd = tokio::process::Command::new(binary);
        cmd.args(crate::etcd_args::etcd_args(spec, &launch))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            // Own process group: a Ctrl-C of the operator does not stop its members.
            .process_group(0)
            .kill_on_drop(false);
        // etcd reads ETCD_* variables as flags; pass none of ours except test bookkeeping.
        for (key, _) in std::env::vars_os() {
            if let Some(k) = key.to_str()
                && k.starts_with("ETCD_")
                && !k.starts_with("ETCD_OPERATOR_")
            {
                cmd.env_remove(k);
            }
        }
        let child = cmd.spawn().map_err(io("start etcd", &file.name))?;
        let pid = child.id().unwrap_or_default();
        let start = proc_state(pid).map(|(_, start)| start).unwrap_or_default();
        let template = local_template_hash(spec).unwrap_or_else(|| "-".to_owned());
        std::fs::write(
            dir.join("etcd.pid"),
            format!("{pid} {start} {} {template}", config.version),
        )
        .map_err(io("write etcd.pid", &file.name))?;
        // Reaped when it exits while we run, which reconciles its cluster at once; after an
        // operator restart it is re-adopted by pid (and looked at, see `exits`).
        self.exits.child(cluster, child);
        tracing::info!(member = %file.name, pid, version = %config.version, state = config.initial_state.as_str(), "started etcd member");
        Ok(())
    }

    /// Fills a member's empty data directory from its snapshot with the restore tool of its
    /// version, before its first start (idempotent: restored data is left as it is).
    async fn restore(
        &self,
        cluster: &ClusterRef,
        dir: &Path,
        file: &MemberFile,
        config: &MemberConfig,
        plan: &crate::restore::RestorePlan,
    ) -> Result<(), RuntimeError> {
        let failed = |source| RuntimeError::Restore {
            member: file.name.clone(),
            source: Box::new(source),
        };
        let tool =
            crate::restore::RestoreTool::for_version(&self.binaries, &config.version).map_err(failed)?;
        let member = crate::restore::RestoreMember {
            name: file.name.clone(),
            peer_url: file.peer_url(),
            initial_cluster: config.initial_cluster_flag(),
            cluster_token: config.cluster_token.clone(),
        };
        crate::restore::prepare_data_dir(
            plan,
            &cluster.namespace,
            &self.restore_credentials,
            &tool,
            &member,
            &dir.join("data"),
        )
        .await
        .map_err(failed)
    }

    /// Asks the member's process to stop and says whether it has: SIGTERM the first time,
    /// SIGKILL once it has had [`STOP_TIMEOUT`]; [`RuntimeError::Waiting`] while it still runs.
    /// Never waits: the next call looks again.
    /// Whether `pid` was asked to stop already.
    fn is_stopping(&self, pid: u32) -> bool {
        self.stopping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(&pid)
    }

    fn stop_process(&self, dir: &Path, name: &str) -> Result<(), RuntimeError> {
        let Some(pid) = running_pid(dir) else {
            return Ok(());
        };
        let Ok(raw) = i32::try_from(pid) else {
            return Ok(());
        };
        let since = {
            let mut stopping = self
                .stopping
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Forget processes that are gone (pids are reused).
            stopping.retain(|p, _| proc_state(*p).is_some_and(|(state, _)| state != 'Z'));
            match stopping.get(&pid) {
                Some(since) => Some(*since),
                None => {
                    stopping.insert(pid, std::time::Instant::now());
                    None
                }
            }
        };
        match since {
            None => {
                let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
                tracing::info!(member = %name, pid, "stopping etcd member");
            }
            Some(since) if since.elapsed() >= STOP_TIMEOUT => {
                tracing::warn!(member = %name, pid, "etcd did not stop on SIGTERM; killing it");
                let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
            }
            Some(_) => {}
        }
        if running_pid(dir).is_some() {
            return Err(RuntimeError::Waiting {
                member: name.to_owned(),
                detail: format!("its etcd process (pid {pid}) is stopping"),
            });
        }
        tracing::info!(member = %name, pid, "stopped etcd member");
        Ok(())
    }
}

/// (running, configured) versions when the member's process runs another etcd version than its
/// configuration says (the pid file records the version each process was started on).
fn stale_version(dir: &Path, file: &MemberFile) -> Option<(String, String)> {
    running_pid(dir)?;
    let text = std::fs::read_to_string(dir.join("etcd.pid")).ok()?;
    let running = text.split_whitespace().nth(2)?.to_owned();
    let configured = file.config.as_ref()?.version.clone();
    (running != configured).then_some((running, configured))
}

/// The template hash the member's running process was started from (the pid file's fourth
/// field; absent for a process started before templates were recorded).
fn running_template(dir: &Path) -> Option<String> {
    running_pid(dir)?;
    let text = std::fs::read_to_string(dir.join("etcd.pid")).ok()?;
    text.split_whitespace()
        .nth(3)
        .filter(|h| *h != "-")
        .map(str::to_owned)
}

/// The local member template: the etcd flags `spec` gives a placeholder member (maintenance,
/// quota and whatever else the spec turns into flags). Addresses, data directory and
/// certificate files are per member and fixed at its reservation, so they do not count.
fn local_template_hash(spec: &ValidatedCluster) -> Option<String> {
    let config = crate::template::placeholder_config();
    let launch = crate::etcd_args::MemberLaunch {
        name: crate::template::PLACEHOLDER_MEMBER,
        config: &config,
        data_dir: String::new(),
        listen_peer_url: String::new(),
        advertise_peer_url: String::new(),
        listen_client_url: String::new(),
        advertise_client_url: String::new(),
        listen_metrics_url: None,
        client_tls: None,
        peer_tls: None,
        force_new_cluster: false,
    };
    crate::template::hash_of(&crate::etcd_args::etcd_args(spec, &launch))
}

/// The pid of the member's etcd if it runs. The pid file holds `<pid> <start time>`, so a pid
/// reused by another process is not mistaken for the member.
/// Makes [`DATA_SEEN_MARKER`] once the running member's data directory exists (one `stat` per
/// look after that). A failure to write it only leaves the member counted as never having had
/// data a while longer; it is logged and tried again at the next look.
fn mark_data_seen(dir: &Path, file: &MemberFile) {
    let marker = dir.join(DATA_SEEN_MARKER);
    if !file.marks_data || marker.exists() || !has_wal(dir) {
        return;
    }
    if let Err(error) = std::fs::write(&marker, b"") {
        tracing::warn!(member = %file.name, error = %etcd_operator_api::report::Chain(&error), "mark the member's data as seen");
    }
}

/// Whether the member's data directory holds etcd's write-ahead log: what etcd itself takes as a
/// member that has data (it starts on it rather than joining or bootstrapping).
fn has_wal(dir: &Path) -> bool {
    dir.join("data").join("member").join("wal").is_dir()
}

fn running_pid(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("etcd.pid")).ok()?;
    let mut parts = text.split_whitespace();
    let pid: u32 = parts.next()?.parse().ok()?;
    let recorded: u64 = parts.next()?.parse().ok()?;
    let (state, start) = proc_state(pid)?;
    (state != 'Z' && start == recorded).then_some(pid)
}

/// State letter and start time (field 22 of `/proc/<pid>/stat`) of a process.
fn proc_state(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: split after the last ')'.
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let start = rest.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Why a member's certificates are renewed, from what the runtime sees of them (`seen`; `None`
/// for a member without TLS) and the on-demand rotation asked; `None` when they are current.
fn renewal_reason(seen: Option<&crate::model::MemberCertificates>, rotation: Option<&str>) -> Option<String> {
    let seen = seen?;
    if let Some(wanted) = rotation
        && seen.rotation.as_deref() != Some(wanted)
    {
        return Some(format!("rotation {wanted:?} was requested"));
    }
    match seen.authority {
        Some(crate::model::AuthorityLag::Trust) => {
            return Some("it does not trust what the cluster's CAs trust now".to_owned());
        }
        Some(crate::model::AuthorityLag::Issuer) => {
            return Some("its certificates are not issued by the cluster's CA".to_owned());
        }
        None => {}
    }
    (seen.valid_for < RENEW_BEFORE).then(|| {
        format!(
            "its certificates are valid for {} more hours, under the {} hours they are renewed before",
            seen.valid_for.as_secs() / 3600,
            RENEW_BEFORE.as_secs() / 3600
        )
    })
}

/// `dir/name`, or `dir/name.<n>` for the first `n` not taken.
fn unused_path(dir: &Path, name: &str) -> PathBuf {
    let plain = dir.join(name);
    if !plain.exists() {
        return plain;
    }
    (1u32..)
        .map(|n| dir.join(format!("{name}.{n}")))
        .find(|p| !p.exists())
        .unwrap_or(plain)
}

/// Deletes all but the `keep` newest (by modification time) directories in `dir`.
fn prune_removed(dir: &Path, keep: usize) -> std::io::Result<()> {
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, path) in entries.into_iter().skip(keep) {
        tracing::info!(path = %path.display(), "deleting the oldest set-aside member data");
        std::fs::remove_dir_all(&path)?;
    }
    Ok(())
}

fn free_port_pair() -> std::io::Result<(u16, u16)> {
    let a = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let b = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

impl Runtime for LocalRuntime {
    async fn members(&self, cluster: &ClusterRef) -> Result<Vec<RuntimeMember>, RuntimeError> {
        let dir = self.cluster_dir(cluster);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(RuntimeError::Io {
                    op: "list members",
                    member: cluster.key(),
                    source: e,
                });
            }
        };
        let mut members = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !path.join("member.json").is_file() {
                continue;
            }
            let file = self.read_member(&path, &name)?;
            members.push(self.to_runtime_member(cluster, &path, &file));
        }
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(members)
    }

    async fn reserve(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<RuntimeMember, RuntimeError> {
        let planes = local_planes(spec)?;
        let dir = self.member_dir(cluster, name);
        if dir.join("member.json").is_file() {
            let file = self.read_member(&dir, name)?;
            return Ok(self.to_runtime_member(cluster, &dir, &file));
        }
        std::fs::create_dir_all(&dir).map_err(io("create member directory", name))?;
        let (peer_port, client_port) = free_port_pair().map_err(io("choose ports", name))?;
        let advertise_peer_port = if self.separate_advertised_peer_port {
            Some(free_port_pair().map_err(io("choose ports", name))?.0)
        } else {
            None
        };
        let file = MemberFile {
            name: name.to_string(),
            peer_port,
            client_port,
            config: None,
            started: false,
            client_tls: planes.client.is_some(),
            peer_tls: planes.peer.is_some(),
            advertise_peer_port,
            reserved_at_ns: chrono::Utc::now().timestamp_nanos_opt(),
            marks_data: true,
        };
        self.write_member(&dir, &file)?;
        Ok(self.to_runtime_member(cluster, &dir, &file))
    }

    async fn start(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        config: &MemberConfig,
    ) -> Result<(), RuntimeError> {
        let dir = self.member_dir(cluster, name);
        if !dir.join("member.json").is_file() {
            return Err(RuntimeError::UnknownMember {
                name: name.to_string(),
            });
        }
        let mut file = self.read_member(&dir, name)?;
        if stale_version(&dir, &file).is_some() {
            self.stop_process(&dir, name)?;
        }
        if running_pid(&dir).is_some() {
            return Ok(());
        }
        // The first configuration sticks: a member always restarts the way it first started.
        let config = file.config.clone().unwrap_or_else(|| config.clone());
        // Fail early (and clearly) when the version cannot run here, before recording anything.
        self.binary(&config.version)?;
        file.config = Some(config.clone());
        self.write_member(&dir, &file)?;
        if !file.started
            && let Some(plan) = &config.restore
        {
            self.restore(cluster, &dir, &file, &config, plan).await?;
        }
        self.launch(cluster, spec, &dir, &mut file, &config, false)?;
        self.record(
            cluster,
            Report::normal(
                "MemberStarted",
                "StartProcess",
                format!("Started member process {name} (etcd {})", config.version),
            ),
        )
        .await;
        Ok(())
    }

    async fn change_version(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
        version: &str,
    ) -> Result<(), RuntimeError> {
        let (dir, mut file, mut config) = self.started_member(
            cluster,
            name,
            "it was never started, so it has no version to change",
        )?;
        // Fail before touching anything when the version cannot run here.
        self.binary(version)?;
        if config.version != version {
            // Record first: an operator killed after this line restarts the member on the new
            // version (the planner sees a stopped member and starts it with this config).
            let from = std::mem::replace(&mut config.version, version.to_string());
            config.previous_version = Some(from.clone());
            file.config = Some(config.clone());
            self.write_member(&dir, &file)?;
            self.stop_process(&dir, name)?;
            self.record(
                cluster,
                Report::normal(
                    "MemberVersionChanging",
                    "RestartProcess",
                    format!("Stopped member process {name} to start it on its data with etcd {version} (was {from})"),
                ),
            )
            .await;
        } else if stale_version(&dir, &file).is_some() {
            self.stop_process(&dir, name)?;
        } else if running_pid(&dir).is_some() {
            return Ok(());
        }
        self.launch(cluster, spec, &dir, &mut file, &config, false)
    }

    async fn renew_certificates(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let (dir, mut file, config) = self.started_member(
            cluster,
            name,
            "it was never started, so it has no certificates to renew",
        )?;
        let reason = renewal_reason(
            self.member_certificates(cluster, &dir, &file).as_ref(),
            spec.certificate_rotation.as_deref(),
        );
        let pid = running_pid(&dir);
        if reason.is_none() && pid.is_some() {
            return Ok(());
        }
        // Told once, as the restart begins (the stop may take a few looks; the start on the new
        // certificates may come from the restart of the stopped member).
        if let (Some(reason), Some(pid)) = (&reason, pid)
            && !self.is_stopping(pid)
        {
            let how = format!("Stopped member process {name} to restart it");
            self.record(
                cluster,
                Report::member_certificates_renewed("StopProcess", &how, reason),
            )
            .await;
        }
        // etcd reads its certificates at start: stop, then start on the new ones (issued by
        // `spawn` since the old ones are expiring or carry another rotation).
        self.stop_process(&dir, name)?;
        self.launch(cluster, spec, &dir, &mut file, &config, false)
    }

    async fn authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<AuthorityView>, RuntimeError> {
        let planes = local_planes(spec)?;
        let now = std::time::SystemTime::now();
        let mut seen = Vec::new();
        for (plane, on) in [
            ("client", planes.client.is_some()),
            ("peer", planes.peer.is_some()),
        ] {
            // Only once the cluster has its CAs (they come with the first member's certificates).
            if !on
                || !self
                    .cluster_dir(cluster)
                    .join("pki")
                    .join(format!("{plane}-ca.crt"))
                    .exists()
            {
                continue;
            }
            let (authority, rotation) = self.plane_cas(cluster, plane).load()?;
            seen.push((authority.phase(), rotation, authority.valid_for(now)));
        }
        Ok(AuthorityView::of(&seen))
    }

    async fn advance_authority(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        to: AuthorityPhase,
        rotation: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let planes = local_planes(spec)?;
        for (plane, on) in [
            ("client", planes.client.is_some()),
            ("peer", planes.peer.is_some()),
        ] {
            if on && let Some(from) = self.plane_cas(cluster, plane).advance(to, rotation)? {
                self.record(cluster, Report::authority_moved(plane, from, to))
                    .await;
            }
        }
        Ok(())
    }

    fn template_hash(&self, _cluster: &ClusterRef, spec: &ValidatedCluster) -> Option<String> {
        local_template_hash(spec)
    }

    /// Members keep their data in a directory on the host: nothing to grow.
    async fn expand_volume(
        &self,
        _cluster: &ClusterRef,
        _spec: &ValidatedCluster,
        _name: &str,
    ) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn recreate(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let (dir, mut file, config) = self.started_member(
            cluster,
            name,
            "it was never started, so it has no process to re-create",
        )?;
        if running_pid(&dir).is_some() && running_template(&dir) == local_template_hash(spec) {
            return Ok(());
        }
        // etcd reads its flags at start: stop (never waiting; `Waiting` until it has stopped),
        // then start on the flags of `spec`.
        self.stop_process(&dir, name)?;
        self.launch(cluster, spec, &dir, &mut file, &config, false)
    }

    async fn recover_quorum(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
        survivor: &str,
    ) -> Result<(), RuntimeError> {
        let (dir, mut file, config) = self.started_member(
            cluster,
            survivor,
            "it was never started, so it has no data to recover from",
        )?;
        if !has_wal(&dir) {
            return Err(RuntimeError::State {
                member: survivor.to_string(),
                detail: "its data directory is gone (it holds no write-ahead log)".into(),
            });
        }
        // Every member stops; the others are removed with their data kept aside (under
        // `.retained/`, for whoever wants to look at it), the survivor starts once with
        // --force-new-cluster: a one-member cluster on its data.
        let mut waiting = None;
        for member in self.members(cluster).await? {
            if let Err(e) = self.stop_process(&self.member_dir(cluster, &member.name), &member.name) {
                waiting.get_or_insert(e);
            }
        }
        if let Some(e) = waiting {
            return Err(e);
        }
        for member in self.members(cluster).await? {
            if member.name != survivor {
                Runtime::remove(self, cluster, &member.name, true).await?;
            }
        }
        self.launch(cluster, spec, &dir, &mut file, &config, true)?;
        self.record(
            cluster,
            Report::quorum_recovered(
                survivor,
                "the other members' data directories were kept under .retained/, not deleted",
            ),
        )
        .await;
        Ok(())
    }

    async fn stop(&self, cluster: &ClusterRef, name: &str) -> Result<(), RuntimeError> {
        let dir = self.member_dir(cluster, name);
        if !dir.join("member.json").is_file() {
            return Err(RuntimeError::UnknownMember {
                name: name.to_string(),
            });
        }
        self.stop_process(&dir, name)
    }

    fn snapshot_dir(&self, cluster: &ClusterRef) -> Option<PathBuf> {
        Some(self.cluster_dir(cluster).join("snapshots"))
    }

    /// A warning in the operator's log, and a Warning Event when Events are on.
    async fn announce_replacement(&self, cluster: &ClusterRef, member: &str, note: &str) {
        tracing::warn!(cluster = %cluster.key(), %member, reason = super::MEMBER_REPLACING_REASON, "{note}");
        self.record(cluster, Report::member_replacing(note)).await;
    }

    /// A warning in the operator's log, and a Warning Event when Events are on.
    async fn warn(&self, cluster: &ClusterRef, reason: &str, action: &str, note: &str) {
        tracing::warn!(cluster = %cluster.key(), %reason, %action, "{note}");
        self.record(cluster, Report::warning(reason, action, note)).await;
    }

    /// With `keep_data` the member's directory moves to `<cluster>/.retained/<member>` (kept
    /// until the cluster is deleted). Without, it moves to `<cluster>/.retained/removed/<member>`
    /// when it holds data, and only the newest [`RETAINED_REMOVED_LIMIT`] there are kept: a
    /// member removed by mistake can still be looked at, and repeated replacements do not fill
    /// the disk.
    async fn remove(&self, cluster: &ClusterRef, name: &str, keep_data: bool) -> Result<(), RuntimeError> {
        let Some(kept) = self.remove_member(cluster, name, keep_data)? else {
            return Ok(());
        };
        self.record(cluster, Report::member_removed(name, "StopProcess", &kept))
            .await;
        Ok(())
    }

    /// The operator's client certificate from the cluster's client CA (`auto` TLS).
    async fn client_tls(
        &self,
        cluster: &ClusterRef,
        spec: &ValidatedCluster,
    ) -> Result<Option<ClientTls>, RuntimeError> {
        if local_planes(spec)?.client.is_none() {
            return Ok(None);
        }
        let authority = self.ensure_authority(cluster, "client")?;
        let ca = &authority.issuing;
        let base = self.cluster_dir(cluster).join("pki").join("operator");
        let now = std::time::SystemTime::now();
        let good = |pair: &PemPair| Ok(ca.verify_client(&pair.cert_pem, now)?);
        let pair = ensure_pair(&base, good, || ca.issue(&member_tls::operator_certificate()))?;
        Ok(Some(ClientTls {
            // Every CA trusted now: members present certificates of either during a rotation.
            ca_pem: authority.bundle(),
            cert_pem: pair.cert_pem,
            key_pem: pair.key_pem,
        }))
    }

    /// A member process that exits reconciles its cluster at once (see `exits`).
    fn watch_children(
        &self,
        controller: kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster>,
    ) -> kube::runtime::Controller<etcd_operator_api::v1alpha2::EtcdCluster> {
        match self.exits.stream() {
            Some(exits) => controller.reconcile_on(exits),
            None => controller,
        }
    }

    /// What no exit tells (a member that stopped answering, a leader change) is seen by
    /// looking: every 3 s.
    fn resync_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(3)
    }

    async fn teardown(&self, cluster: &ClusterRef, keep_data: bool) -> Result<(), RuntimeError> {
        let mut waiting = None;
        for member in self.members(cluster).await? {
            let dir = self.member_dir(cluster, &member.name);
            if let Err(e) = self.stop_process(&dir, &member.name) {
                waiting.get_or_insert(e);
            }
        }
        if let Some(e) = waiting {
            return Err(e);
        }
        if !keep_data {
            let dir = self.cluster_dir(cluster);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(RuntimeError::Io {
                        op: "delete cluster data",
                        member: cluster.key(),
                        source: e,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::InitialState;
    use crate::tls::ca::CertificateAuthority;

    /// Runs a runtime call again while it answers that it waits (a process stopping), as the
    /// controller's next reconcile would.
    macro_rules! done {
        ($call:expr) => {{
            let mut tries = 0;
            loop {
                match $call.await {
                    Err(RuntimeError::Waiting { .. }) if tries < 800 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                    other => break other,
                }
            }
        }};
    }

    fn cluster() -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        }
    }

    fn spec() -> ValidatedCluster {
        ValidatedCluster::for_test(Default::default())
    }

    /// The configuration of a cluster of `m` alone, on `version`.
    fn alone(m: &RuntimeMember, version: &str) -> MemberConfig {
        MemberConfig {
            version: version.into(),
            initial_cluster: vec![(m.name.clone(), m.peer_url.clone())],
            initial_state: InitialState::New,
            cluster_token: "t".into(),
            previous_version: None,
            restore: None,
        }
    }

    fn binaries() -> PathBuf {
        etcd_operator_tests::tools::tools_dir().join("etcd")
    }

    #[test]
    fn a_renewal_says_why_and_current_certificates_need_none() {
        use crate::model::{AuthorityLag, MemberCertificates};
        let good = MemberCertificates {
            valid_for: RENEW_BEFORE * 2,
            rotation: Some("r1".into()),
            authority: None,
        };
        assert_eq!(renewal_reason(None, Some("r1")), None, "a member without TLS");
        assert_eq!(renewal_reason(Some(&good), Some("r1")), None);
        assert_eq!(renewal_reason(Some(&good), None), None);
        assert_eq!(
            renewal_reason(Some(&good), Some("r2")).as_deref(),
            Some("rotation \"r2\" was requested")
        );
        let lagging = MemberCertificates {
            authority: Some(AuthorityLag::Issuer),
            ..good.clone()
        };
        assert_eq!(
            renewal_reason(Some(&lagging), Some("r1")).as_deref(),
            Some("its certificates are not issued by the cluster's CA")
        );
        let expiring = MemberCertificates {
            valid_for: Duration::from_secs(3 * 3600),
            ..good
        };
        let why = renewal_reason(Some(&expiring), None).unwrap();
        assert!(
            why.starts_with("its certificates are valid for 3 more hours"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn reserve_is_idempotent_and_persisted() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let a = rt.reserve(&cluster(), &spec(), "c-aaaaa").await.unwrap();
        let again = rt.reserve(&cluster(), &spec(), "c-aaaaa").await.unwrap();
        assert_eq!(a, again);
        assert_eq!(a.liveness, Liveness::Reserved);
        let fresh = LocalRuntime::new(root.path(), binaries());
        assert_eq!(fresh.members(&cluster()).await.unwrap(), vec![a.clone()]);
        // When it was reserved is kept too (a scale down removes the newest first).
        let b = rt.reserve(&cluster(), &spec(), "c-bbbbb").await.unwrap();
        assert!(
            a.created.is_some() && a.created < b.created,
            "{:?} {:?}",
            a.created,
            b.created
        );
        // A member file of before the time was recorded reads as unknown.
        let dir = rt.member_dir(&cluster(), "c-aaaaa");
        let text = std::fs::read_to_string(dir.join("member.json")).unwrap();
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(old.as_object_mut().unwrap().remove("reservedAtNs").is_some());
        std::fs::write(dir.join("member.json"), old.to_string()).unwrap();
        let members = fresh.members(&cluster()).await.unwrap();
        assert_eq!(members[0].name, "c-aaaaa");
        assert_eq!(members[0].created, None, "{members:?}");
        assert_eq!(members[1].created, b.created);
    }

    #[tokio::test]
    async fn a_separate_advertised_peer_port_is_recorded_and_advertised() {
        let root = tempfile::tempdir().unwrap();
        let plain = LocalRuntime::new(root.path().join("plain"), binaries());
        let m = plain.reserve(&cluster(), &spec(), "c-a").await.unwrap();
        let file = plain
            .read_member(&plain.member_dir(&cluster(), "c-a"), "c-a")
            .unwrap();
        assert_eq!(file.advertise_peer_port, None);
        assert_eq!(m.peer_url, file.listen_peer_url());

        let proxied =
            LocalRuntime::new(root.path().join("proxied"), binaries()).with_separate_advertised_peer_ports();
        let m = proxied.reserve(&cluster(), &spec(), "c-a").await.unwrap();
        let file = proxied
            .read_member(&proxied.member_dir(&cluster(), "c-a"), "c-a")
            .unwrap();
        let advertised = file.advertise_peer_port.unwrap();
        assert_ne!(advertised, file.peer_port);
        assert_eq!(m.peer_url, format!("http://127.0.0.1:{advertised}"));
        assert_eq!(
            file.listen_peer_url(),
            format!("http://127.0.0.1:{}", file.peer_port)
        );
        // Recorded in member.json, as tests read it.
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(proxied.member_dir(&cluster(), "c-a").join("member.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(json["advertisePeerPort"], advertised);
    }

    #[tokio::test]
    async fn removed_members_data_is_set_aside_and_only_the_newest_are_kept() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let cluster_dir = root.path().join("ns").join("c");
        let removed = cluster_dir.join(".retained").join("removed");
        let mut names = Vec::new();
        for i in 0..=RETAINED_REMOVED_LIMIT {
            let name = format!("c-{i:05}");
            rt.reserve(&cluster(), &spec(), &name).await.unwrap();
            let data = rt.member_dir(&cluster(), &name).join("data");
            std::fs::create_dir_all(data.join("member")).unwrap();
            std::fs::write(data.join("member").join("db"), name.as_bytes()).unwrap();
            done!(rt.remove(&cluster(), &name, false)).unwrap();
            assert!(!rt.member_dir(&cluster(), &name).exists());
            assert_eq!(
                std::fs::read(removed.join(&name).join("data/member/db")).unwrap(),
                name.as_bytes()
            );
            names.push(name);
            // Removal times one after the other, so the order is plain.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // One more than the limit: the oldest went.
        let mut kept: Vec<String> = std::fs::read_dir(&removed)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        assert_eq!(kept, names[1..]);
        // Not among the members.
        assert!(rt.members(&cluster()).await.unwrap().is_empty());

        // A member without data leaves nothing behind; one kept on purpose is never pruned.
        rt.reserve(&cluster(), &spec(), "c-empty").await.unwrap();
        done!(rt.remove(&cluster(), "c-empty", false)).unwrap();
        assert!(!removed.join("c-empty").exists());
        rt.reserve(&cluster(), &spec(), "c-keep").await.unwrap();
        done!(rt.remove(&cluster(), "c-keep", true)).unwrap();
        assert!(cluster_dir.join(".retained").join("c-keep").is_dir());
    }

    #[tokio::test]
    async fn a_missing_version_is_a_clear_error_and_records_nothing() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let m = rt.reserve(&cluster(), &spec(), "c-bbbbb").await.unwrap();
        let config = alone(&m, "3.9.9");
        let err = rt.start(&cluster(), &spec(), &m.name, &config).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("etcd 3.9.9 is not available") && text.contains("3.5.1"),
            "{text}"
        );
        assert_eq!(rt.members(&cluster()).await.unwrap()[0].config, None);
    }

    #[tokio::test]
    async fn a_member_runs_survives_a_new_runtime_and_is_removed() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let m = rt.reserve(&cluster(), &spec(), "c-ccccc").await.unwrap();
        let config = alone(&m, "3.5.1");
        rt.start(&cluster(), &spec(), &m.name, &config).await.unwrap();
        // Re-adopted by a fresh runtime (as after an operator restart).
        let fresh = LocalRuntime::new(root.path(), binaries());
        let seen = fresh.members(&cluster()).await.unwrap();
        assert_eq!(seen[0].liveness, Liveness::Running);
        let view = {
            let mut v = None;
            for _ in 0..100 {
                v = crate::member_ops::MemberOps::observe(
                    &crate::member_ops::EtcdClient::default(),
                    std::slice::from_ref(&m.client_url),
                )
                .await
                .ok();
                if v.as_ref().is_some_and(|v| v.leader != 0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            v.unwrap()
        };
        assert_eq!(view.members.len(), 1);
        assert_eq!(view.members[0].name, "c-ccccc");
        done!(fresh.teardown(&cluster(), false)).unwrap();
        assert!(fresh.members(&cluster()).await.unwrap().is_empty());
        assert!(!root.path().join("ns").join("c").exists());
    }

    /// A first start that fails before etcd makes its data (its client port taken) leaves a
    /// member to start again; once it ran with data, a data directory that is missing or holds no
    /// write-ahead log means the data is gone; in a member file of before the marker, too.
    #[tokio::test]
    async fn a_member_whose_first_start_failed_is_started_again_and_one_whose_data_went_is_not() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let m = rt.reserve(&cluster(), &spec(), "c-fffff").await.unwrap();
        let port: u16 = m.client_url.rsplit(':').next().unwrap().parse().unwrap();
        let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let config = alone(&m, "3.5.1");
        rt.start(&cluster(), &spec(), &m.name, &config).await.unwrap();
        let dir = rt.member_dir(&cluster(), &m.name);
        let liveness = async || rt.members(&cluster()).await.unwrap()[0].liveness.clone();
        let mut seen = liveness().await;
        for _ in 0..100 {
            if matches!(seen, Liveness::Gone { .. }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            seen = liveness().await;
        }
        assert!(
            !dir.join("data").exists(),
            "etcd made data before failing to bind"
        );
        assert_eq!(
            seen,
            Liveness::Gone {
                reason: "its first start exited before etcd made its data directory".into(),
                restartable: true
            }
        );

        drop(squatter);
        rt.start(&cluster(), &spec(), &m.name, &config).await.unwrap();
        for _ in 0..100 {
            if has_wal(&dir) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(liveness().await, Liveness::Running);
        assert!(dir.join(DATA_SEEN_MARKER).exists(), "the data was marked");
        let pid = running_pid(&dir).unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        for _ in 0..100 {
            if running_pid(&dir).is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Its data emptied to what etcd leaves when it starts on an empty directory as a member
        // the cluster already has: a database and no write-ahead log. That is data gone too.
        std::fs::remove_dir_all(dir.join("data").join("member").join("wal")).unwrap();
        assert!(dir.join("data").join("member").join("snap").join("db").exists());
        assert_eq!(
            liveness().await,
            Liveness::Gone {
                reason:
                    "the process exited and its data directory holds no write-ahead log: its data is gone"
                        .into(),
                restartable: false,
            }
        );
        std::fs::remove_dir_all(dir.join("data")).unwrap();
        let gone = Liveness::Gone {
            reason: "the process exited and its data directory is gone".into(),
            restartable: false,
        };
        assert_eq!(liveness().await, gone);
        // A file of before the marker: a missing data directory means the data is gone.
        std::fs::remove_file(dir.join(DATA_SEEN_MARKER)).unwrap();
        let text = std::fs::read_to_string(dir.join("member.json")).unwrap();
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            old.as_object_mut().unwrap().remove("marksData"),
            Some(serde_json::json!(true))
        );
        std::fs::write(dir.join("member.json"), old.to_string()).unwrap();
        assert_eq!(liveness().await, gone);
        done!(rt.teardown(&cluster(), false)).unwrap();
    }

    async fn wait_for_version(url: &str, version: &str) -> crate::model::EtcdView {
        for _ in 0..150 {
            if let Ok(v) = crate::member_ops::MemberOps::observe(
                &crate::member_ops::EtcdClient::default(),
                &[url.to_string()],
            )
            .await
                && v.leader != 0
                && v.members[0].status.as_ref().is_some_and(|s| s.version == version)
            {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("member at {url} never ran etcd {version}");
    }

    #[tokio::test]
    async fn a_member_changes_version_keeping_its_data_and_refuses_a_missing_version() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let m = rt.reserve(&cluster(), &spec(), "c-ddddd").await.unwrap();
        let config = alone(&m, "3.5.0");
        rt.start(&cluster(), &spec(), &m.name, &config).await.unwrap();
        let before = wait_for_version(&m.client_url, "3.5.0").await;
        let mut client = etcd_client::Client::connect([m.client_url.as_str()], None)
            .await
            .unwrap();
        client.put("kept", "yes", None).await.unwrap();

        // A version without a binary: a clear error, and nothing changed (still 3.5.0, running).
        let err = rt
            .change_version(&cluster(), &spec(), &m.name, "3.5.9")
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::VersionUnavailable { .. }), "{err}");
        let seen = &rt.members(&cluster()).await.unwrap()[0];
        assert_eq!(seen.config.as_ref().unwrap().version, "3.5.0");
        assert_eq!(seen.liveness, Liveness::Running);

        done!(rt.change_version(&cluster(), &spec(), &m.name, "3.5.1")).unwrap();
        let seen = &rt.members(&cluster()).await.unwrap()[0];
        let recorded = seen.config.clone().unwrap();
        assert_eq!(
            (recorded.version.as_str(), recorded.previous_version.as_deref()),
            ("3.5.1", Some("3.5.0"))
        );
        let after = wait_for_version(&m.client_url, "3.5.1").await;
        assert_eq!(after.cluster_id, before.cluster_id, "same cluster, same data");
        let mut client = etcd_client::Client::connect([m.client_url.as_str()], None)
            .await
            .unwrap();
        let got = client.get("kept", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"yes");
        // Again with the same version: it runs, nothing restarts.
        let pid = std::fs::read_to_string(root.path().join("ns/c/c-ddddd/etcd.pid")).unwrap();
        done!(rt.change_version(&cluster(), &spec(), &m.name, "3.5.1")).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.path().join("ns/c/c-ddddd/etcd.pid")).unwrap(),
            pid
        );

        // An operator that died between recording a new version and restarting the member
        // leaves the old process running: it counts as stopped, and a start restarts it on the
        // recorded version.
        let json = root.path().join("ns/c/c-ddddd/member.json");
        let recorded = std::fs::read_to_string(&json).unwrap();
        std::fs::write(
            &json,
            recorded.replace("\"version\": \"3.5.1\"", "\"version\": \"3.5.0\""),
        )
        .unwrap();
        let seen = rt.members(&cluster()).await.unwrap().remove(0);
        let Liveness::Gone {
            reason,
            restartable: true,
        } = &seen.liveness
        else {
            panic!(
                "expected a stale process to count as stopped: {:?}",
                seen.liveness
            )
        };
        assert!(reason.contains("still runs etcd 3.5.1"), "{reason}");
        // The start stops the stale process first: it answers that it waits until it is gone.
        assert!(matches!(
            rt.start(&cluster(), &spec(), &m.name, seen.config.as_ref().unwrap())
                .await,
            Err(RuntimeError::Waiting { .. })
        ));
        done!(rt.start(&cluster(), &spec(), &m.name, seen.config.as_ref().unwrap())).unwrap();
        wait_for_version(&m.client_url, "3.5.0").await;
        assert_eq!(
            rt.members(&cluster()).await.unwrap()[0].liveness,
            Liveness::Running
        );

        // Stop keeps data and config: restartable.
        done!(Runtime::stop(&rt, &cluster(), &m.name)).unwrap();
        assert!(matches!(
            rt.members(&cluster()).await.unwrap()[0].liveness,
            Liveness::Gone {
                restartable: true,
                ..
            }
        ));
        assert_eq!(
            rt.snapshot_dir(&cluster()),
            Some(root.path().join("ns").join("c").join("snapshots"))
        );
        done!(rt.teardown(&cluster(), false)).unwrap();
    }

    fn tls_spec() -> ValidatedCluster {
        let mut cluster = etcd_operator_api::v1alpha2::EtcdCluster::default();
        cluster.spec.tls = Some(Box::new(etcd_operator_api::v1alpha2::TlsSpec {
            client: Some(etcd_operator_api::v1alpha2::TlsPlane {
                auto: Some(etcd_operator_api::v1alpha2::AutoTls {}),
                ..Default::default()
            }),
            peer: None,
        }));
        ValidatedCluster::for_test(cluster)
    }

    #[tokio::test]
    async fn the_operators_certificate_is_kept_while_good_and_issued_again_when_not() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let first = rt.client_tls(&cluster(), &tls_spec()).await.unwrap().unwrap();
        let again = rt.client_tls(&cluster(), &tls_spec()).await.unwrap().unwrap();
        assert_eq!(first, again, "a good certificate is kept");
        let ca = CertificateAuthority::load(
            &first.ca_pem,
            &std::fs::read_to_string(root.path().join("ns/c/pki/client-ca.key")).unwrap(),
        )
        .unwrap();
        let pki = root.path().join("ns/c/pki");

        // Expiring within RENEW_BEFORE: issued again, from the same CA.
        let short = ca
            .issue(&crate::tls::ca::LeafSpec {
                validity: Duration::from_secs(24 * 3600),
                ..member_tls::operator_certificate()
            })
            .unwrap();
        std::fs::write(pki.join("operator.crt"), &short.cert_pem).unwrap();
        std::fs::write(pki.join("operator.key"), &short.key_pem).unwrap();
        let renewed = rt.client_tls(&cluster(), &tls_spec()).await.unwrap().unwrap();
        assert_ne!(renewed.cert_pem, short.cert_pem);
        assert_eq!(renewed.ca_pem, first.ca_pem);
        ca.verify_client(&renewed.cert_pem, std::time::SystemTime::now())
            .unwrap();

        // A key that is not the certificate's: issued again.
        let other = ca.issue(&member_tls::operator_certificate()).unwrap();
        std::fs::write(pki.join("operator.key"), &other.key_pem).unwrap();
        let fixed = rt.client_tls(&cluster(), &tls_spec()).await.unwrap().unwrap();
        assert!(pair_matches(&PemPair {
            cert_pem: fixed.cert_pem.clone(),
            key_pem: fixed.key_pem.clone()
        }));
        assert_ne!(fixed.cert_pem, renewed.cert_pem);

        // Plain clusters have no identity and get no files.
        let plain = LocalRuntime::new(root.path().join("plain"), binaries());
        assert_eq!(plain.client_tls(&cluster(), &spec()).await.unwrap(), None);
        assert!(!root.path().join("plain").exists());
    }

    /// The recorded pid of a member's etcd.
    fn pid_of(root: &Path, name: &str) -> String {
        std::fs::read_to_string(root.join("ns/c").join(name).join("etcd.pid")).unwrap()
    }

    #[tokio::test]
    async fn certificates_are_renewed_when_expiring_or_rotated_and_the_member_restarts_on_them() {
        let root = tempfile::tempdir().unwrap();
        let rt = LocalRuntime::new(root.path(), binaries());
        let spec = tls_spec();
        let m = rt.reserve(&cluster(), &spec, "c-rrrrr").await.unwrap();
        // Reserved, never started: no certificates yet.
        assert_eq!(m.certificates, None);
        let config = alone(&m, "3.5.1");
        rt.start(&cluster(), &spec, &m.name, &config).await.unwrap();
        let seen = rt.members(&cluster()).await.unwrap().remove(0);
        let certs = seen.certificates.unwrap();
        assert!(certs.valid_for > RENEW_BEFORE, "{certs:?}");
        assert_eq!(certs.rotation, None);

        // Current certificates and a running member: nothing happens.
        let pid = pid_of(root.path(), &m.name);
        let tls = root.path().join("ns/c/c-rrrrr/tls");
        let server = std::fs::read_to_string(tls.join("server.crt")).unwrap();
        done!(rt.renew_certificates(&cluster(), &spec, &m.name)).unwrap();
        assert_eq!(pid_of(root.path(), &m.name), pid);
        assert_eq!(std::fs::read_to_string(tls.join("server.crt")).unwrap(), server);

        // Expiring in a day: reported, then issued again and the member restarted.
        let ca = CertificateAuthority::load(
            &std::fs::read_to_string(root.path().join("ns/c/pki/client-ca.crt")).unwrap(),
            &std::fs::read_to_string(root.path().join("ns/c/pki/client-ca.key")).unwrap(),
        )
        .unwrap();
        let short = ca
            .issue(&crate::tls::ca::LeafSpec {
                validity: Duration::from_secs(24 * 3600),
                ..member_tls::server_certificate(&m.name, std::slice::from_ref(&m.name))
            })
            .unwrap();
        std::fs::write(tls.join("server.crt"), &short.cert_pem).unwrap();
        std::fs::write(tls.join("server.key"), &short.key_pem).unwrap();
        let seen = rt.members(&cluster()).await.unwrap().remove(0);
        assert!(seen.certificates.unwrap().valid_for <= Duration::from_secs(24 * 3600));
        done!(rt.renew_certificates(&cluster(), &spec, &m.name)).unwrap();
        let renewed = std::fs::read_to_string(tls.join("server.crt")).unwrap();
        assert_ne!(renewed, short.cert_pem);
        assert_ne!(
            pid_of(root.path(), &m.name),
            pid,
            "restarted on the new certificate"
        );
        let seen = rt.members(&cluster()).await.unwrap().remove(0);
        assert_eq!(seen.liveness, Liveness::Running);
        assert!(seen.certificates.unwrap().valid_for > RENEW_BEFORE);

        // A rotation asked for: issued again under it, recorded, restarted; asked again: kept.
        let mut rotated = spec.clone();
        rotated.certificate_rotation = Some("r1".to_owned());
        let pid = pid_of(root.path(), &m.name);
        done!(rt.renew_certificates(&cluster(), &rotated, &m.name)).unwrap();
        assert_ne!(std::fs::read_to_string(tls.join("server.crt")).unwrap(), renewed);
        assert_ne!(pid_of(root.path(), &m.name), pid);
        let seen = rt.members(&cluster()).await.unwrap().remove(0);
        assert_eq!(seen.certificates.unwrap().rotation.as_deref(), Some("r1"));
        let pid = pid_of(root.path(), &m.name);
        done!(rt.renew_certificates(&cluster(), &rotated, &m.name)).unwrap();
        assert_eq!(
            pid_of(root.path(), &m.name),
            pid,
            "the same rotation is not done twice"
        );

        // Unknown and never-started members are errors, not silent successes.
        assert!(matches!(
            done!(rt.renew_certificates(&cluster(), &spec, "c-nobody")),
            Err(RuntimeError::UnknownMember { .. })
        ));
        rt.reserve(&cluster(), &spec, "c-unstarted").await.unwrap();
        assert!(matches!(
            done!(rt.renew_certificates(&cluster(), &spec, "c-unstarted")),
            Err(RuntimeError::State { .. })
        ));
        done!(rt.teardown(&cluster(), false)).unwrap();
    }
}
