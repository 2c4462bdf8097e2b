//! [`MemberOps`] through etcd-client: one cached gRPC client per endpoint set (a member's own
//! URL, or the voters a membership call may go to), dropped when a call to it times out or its
//! transport fails, so a member that moved or died is reconnected afresh next time.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions, ConnectOptions, DowngradeOptions,
    GetOptions, MemberAddOptions,
};

use etcd_operator_etcd_errors::{self as etcd_errors, EtcdErrorKind};
use futures::StreamExt;

use super::{MemberOpError, MemberOps, SavedSnapshot, Snapshot, SnapshotError, SnapshotStream};
use crate::model::{AlarmKind, EtcdMember, EtcdView, MemberAlarm, MemberHealth};
use crate::tls::member::ClientTls;

/// How long one etcd call may take before the member counts as not answering.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a defragmentation may take (the member does not serve meanwhile; etcd rewrites its
/// whole database file).
const DEFRAGMENT_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a whole snapshot stream may take (every snapshot, whoever asks for it).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);
/// Cached clients kept at most; past this the cache starts again empty (endpoint sets of
/// deleted clusters are never asked for again).
const MAX_CACHED_CLIENTS: usize = 256;

/// A cached client's key: the endpoints and the fingerprint of the identity presented to them.
type CacheKey = (Vec<String>, String);

/// The real [`MemberOps`]: etcd-client with cached connections. Cheap to clone (the cache is
/// shared).
#[derive(Clone, Default)]
pub struct EtcdClient {
    /// Clients by (endpoints, TLS identity fingerprint).
    clients: Arc<Mutex<HashMap<CacheKey, Client>>>,
    /// The identity to present to each TLS member endpoint.
    tls: Arc<Mutex<HashMap<String, ClientTls>>>,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached = self.clients.lock().map(|c| c.len()).unwrap_or_default();
        f.debug_struct("EtcdClient")
            .field("cached", &cached)
            .field(
                "tls_endpoints",
                &self.tls.lock().map(|t| t.len()).unwrap_or_default(),
            )
            .finish()
    }
}

/// An etcd error as a [`MemberOpError`], by the one classification of etcd's errors
/// ([`etcd_operator_etcd_errors::classify`]): "not yet" answers become
/// [`MemberOpError::NotReadyYet`], TLS handshake failures [`MemberOpError::Tls`].
fn classify(op: &'static str, source: etcd_client::Error) -> MemberOpError {
    match etcd_errors::classify(&source) {
        EtcdErrorKind::NotReadyYet => MemberOpError::NotReadyYet {
            op,
            detail: etcd_errors::status_message(&source)
                .unwrap_or_default()
                .to_owned(),
        },
        EtcdErrorKind::TlsHandshake => MemberOpError::Tls {
            op,
            detail: etcd_errors::tls_failure(&source)
                .map(ToString::to_string)
                .unwrap_or_default(),
        },
        _ => MemberOpError::Etcd { op, source },
    }
}

/// Whether the cached client should go after this error. Any failure but etcd's own "not yet"
/// answer drops it: a dead member surfaces as a timeout, a transport error or an `Unavailable`
/// status depending on when the channel noticed, and a new client costs one connection.
fn connection_failed(error: &MemberOpError) -> bool {
    !matches!(
        error,
        MemberOpError::NotReadyYet { .. } | MemberOpError::NoEndpoint { .. }
    )
}

/// Runs `fut` with the call timeout.
async fn timed<T>(
    op: &'static str,
    fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, MemberOpError> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(classify(op, source)),
        Err(_) => Err(MemberOpError::Timeout {
            op,
            after: CALL_TIMEOUT,
        }),
    }
}

impl EtcdClient {
    /// How many clients are cached (for tests of the cache).
    pub fn cached(&self) -> usize {
        self.clients.lock().map(|c| c.len()).unwrap_or_default()
    }

    /// The cached client for `endpoints`, connecting when there is none.
    async fn client(&self, endpoints: &[String], op: &'static str) -> Result<Client, MemberOpError> {
        if endpoints.is_empty() {
            return Err(MemberOpError::NoEndpoint { op });
        }
        let tls = self.tls_for(endpoints);
        let key = self.key(endpoints);
        if let Some(client) = self.clients.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(client);
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(CALL_TIMEOUT);
        if let Some(tls) = &tls {
            options = options.with_tls(tls.options());
        }
        let client = match tokio::time::timeout(CALL_TIMEOUT, Client::connect(endpoints, Some(options))).await
        {
            Ok(Ok(client)) => client,
            Ok(Err(source)) => return Err(classify(op, source)),
            Err(_) => {
                return Err(MemberOpError::Timeout {
                    op,
                    after: CALL_TIMEOUT,
                });
            }
        };
        if let Ok(mut cache) = self.clients.lock() {
            if cache.len() >= MAX_CACHED_CLIENTS {
                cache.clear();
            }
            cache.insert(key, client.clone());
        }
        Ok(client)
    }

    /// Forgets the cached client of `endpoints` when `result` says its connection is bad.
    fn keep_or_forget<T>(
        &self,
        endpoints: &[String],
        result: Result<T, MemberOpError>,
    ) -> Result<T, MemberOpError> {
        if let Err(error) = &result
            && connection_failed(error)
        {
            let key = self.key(endpoints);
            if let Ok(mut cache) = self.clients.lock() {
                cache.remove(&key);
            }
        }
        result
    }

    /// The TLS identity registered for `endpoints` (the first that has one).
    fn tls_for(&self, endpoints: &[String]) -> Option<ClientTls> {
        let tls = self.tls.lock().ok()?;
        endpoints.iter().find_map(|e| tls.get(e).cloned())
    }

    /// The cache key of `endpoints`: the endpoints and the identity presented to them.
    fn key(&self, endpoints: &[String]) -> CacheKey {
        let fingerprint = self
            .tls_for(endpoints)
            .map(|t| t.fingerprint())
            .unwrap_or_default();
        (endpoints.to_vec(), fingerprint)
    }

    /// A connection of its own to `endpoints` whose calls may take up to [`DEFRAGMENT_TIMEOUT`]
    /// (maintenance calls that rewrite or sweep the database), not cached.
    async fn long_client(&self, endpoints: &[String], op: &'static str) -> Result<Client, MemberOpError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(DEFRAGMENT_TIMEOUT);
        if let Some(tls) = self.tls_for(endpoints) {
            options = options.with_tls(tls.options());
        }
        Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| classify(op, e))
    }

    /// The status of one member, asked at its own client URL, and whether it names an alarm
    /// raised in the cluster (a member's status lists every alarm, from its own copy).
    async fn member_status(&self, url: &str) -> (Option<MemberHealth>, bool) {
        let endpoints = [url.to_string()];
        let result = async {
            let mut client = self.client(&endpoints, "status").await?;
            timed("status", client.status()).await
        }
        .await;
        let Ok(status) = self.keep_or_forget(&endpoints, result) else {
            return (None, false);
        };
        let alarmed = status
            .errors()
            .iter()
            .any(|e| etcd_errors::is_alarm_status_error(e));
        let health = MemberHealth {
            version: status.version().to_string(),
            raft_applied_index: status.raft_applied_index(),
            leader: status.leader(),
            errors: status
                .errors()
                .iter()
                .filter(|e| !etcd_errors::is_alarm_status_error(e))
                .cloned()
                .collect(),
            db_size: u64::try_from(status.db_size()).unwrap_or_default(),
            db_size_in_use: u64::try_from(status.raft_used_db_size()).unwrap_or_default(),
            storage_version: Some(status.storage_version().to_owned()).filter(|v| !v.is_empty()),
            downgrade_target: status
                .downgrade_info()
                .filter(|d| d.enabled())
                .map(|d| d.target_version().to_owned()),
        };
        (Some(health), alarmed)
    }

    /// The alarms raised in the cluster, asked at `endpoint` (empty when it does not answer).
    async fn alarms(&self, endpoint: &str) -> Vec<MemberAlarm> {
        let endpoints = [endpoint.to_string()];
        let result = async {
            let mut client = self.client(&endpoints, "alarm list").await?;
            timed(
                "alarm list",
                client.alarm(AlarmAction::Get, AlarmType::None, None),
            )
            .await
        }
        .await;
        match self.keep_or_forget(&endpoints, result) {
            Ok(list) => list
                .alarms()
                .iter()
                .filter_map(|a| {
                    let alarm = match a.alarm() {
                        AlarmType::Nospace => AlarmKind::NoSpace,
                        AlarmType::Corrupt => AlarmKind::Corrupt,
                        AlarmType::None => return None,
                    };
                    Some(MemberAlarm {
                        member: a.member_id(),
                        alarm,
                    })
                })
                .collect(),
            Err(error) => {
                tracing::debug!(%endpoint, error = %etcd_operator_api::report::Chain(&error), "no alarm list");
                Vec::new()
            }
        }
    }

    /// Opens a snapshot stream at `endpoint`, after reading the revision it holds at least.
    async fn open_snapshot(
        &self,
        endpoint: &str,
    ) -> Result<(i64, etcd_client::SnapshotStreaming), SnapshotError> {
        let endpoints = [endpoint.to_string()];
        let etcd = |source| SnapshotError::Etcd {
            endpoint: endpoint.to_owned(),
            source,
        };
        let result = async {
            let mut client = self.client(&endpoints, "snapshot").await?;
            // The revision first: the snapshot that follows contains at least this revision.
            let head = timed(
                "snapshot",
                client.get("\0", Some(GetOptions::new().with_count_only())),
            )
            .await?;
            let revision = head.header().map(|h| h.revision()).unwrap_or_default();
            let stream = timed("snapshot", client.snapshot()).await?;
            Ok((revision, stream))
        }
        .await;
        self.keep_or_forget(&endpoints, result).map_err(etcd)
    }

    /// Opens the checked chunk stream of a snapshot at `endpoint`.
    async fn stream_snapshot(&self, endpoint: &str) -> Result<SnapshotStream, SnapshotError> {
        let taken = chrono::Utc::now();
        let (revision, stream) = self.open_snapshot(endpoint).await?;
        let owner = endpoint.to_owned();
        let chunks = futures::stream::try_unfold(stream, move |mut stream| {
            let endpoint = owner.clone();
            async move {
                let next = stream.message().await.map_err(|source| SnapshotError::Etcd {
                    endpoint,
                    source: classify("snapshot", source),
                })?;
                Ok(next.map(|chunk| (bytes::Bytes::copy_from_slice(chunk.blob()), stream)))
            }
        });
        Ok(SnapshotStream::new(
            revision,
            endpoint,
            taken,
            chunks.boxed(),
            SNAPSHOT_TIMEOUT,
        ))
    }
}

impl MemberOps for EtcdClient {
    fn use_tls(&self, endpoints: &[String], tls: Option<&ClientTls>) {
        if let Ok(mut map) = self.tls.lock() {
            if map.len() > MAX_CACHED_CLIENTS * 8 {
                // Endpoints of deleted clusters are never asked for again; the live clusters
                // register theirs again at their next reconcile.
                map.clear();
            }
            for endpoint in endpoints {
                match tls {
                    Some(tls) => {
                        map.insert(endpoint.clone(), tls.clone());
                    }
                    None => {
                        map.remove(endpoint);
                    }
                }
            }
        }
    }

    async fn observe(&self, endpoints: &[String]) -> Result<EtcdView, MemberOpError> {
        // Any member answers the member list; they are asked in order, hedged: a member that
        // has just started and does not listen yet, or a frozen one that never answers, costs a
        // moment, not the call timeout (see `hedge`).
        let answer = super::hedge::first_answer(endpoints.len(), super::hedge::HEDGE_AFTER, |i| {
            let one = std::slice::from_ref(&endpoints[i]);
            async move {
                let result = async {
                    let mut client = self.client(one, "member list").await?;
                    timed("member list", client.member_list()).await
                }
                .await;
                self.keep_or_forget(one, result)
            }
        })
        .await;
        let (list, answered) = match answer {
            Ok((i, list)) => (list, &endpoints[i]),
            // A TLS failure says more than another member's silence: it is the one reported.
            Err(errors) => {
                let mut errors: Vec<MemberOpError> = errors.into_iter().map(|(_, e)| e).collect();
                let tls = errors.iter().position(|e| matches!(e, MemberOpError::Tls { .. }));
                return Err(match tls {
                    Some(i) => errors.swap_remove(i),
                    None => errors
                        .pop()
                        .unwrap_or(MemberOpError::NoEndpoint { op: "member list" }),
                });
            }
        };
        // Every member's status at once (each answers from its own state): a silent member costs
        // one call timeout in all.
        let answers = futures::future::join_all(list.members().iter().map(|m| {
            let url = m.client_urls().first().cloned();
            async move {
                match url {
                    Some(url) => self.member_status(&url).await,
                    None => (None, false),
                }
            }
        }))
        .await;
        // The typed alarm list goes through raft, so it waits for a leader (a call timeout
        // during an election): it is asked only when a member's status says an alarm is raised.
        let alarms = if answers.iter().any(|(_, alarmed)| *alarmed) {
            self.alarms(answered).await
        } else {
            Vec::new()
        };
        let statuses = answers.into_iter().map(|(health, _)| health);
        let mut view = EtcdView {
            cluster_id: list.header().map(|h| h.cluster_id()).unwrap_or_default(),
            alarms,
            ..Default::default()
        };
        for (m, health) in list.members().iter().zip(statuses) {
            if let Some(h) = &health
                && h.leader != 0
            {
                view.leader = h.leader;
            }
            view.members.push(EtcdMember {
                id: m.id(),
                name: m.name().to_string(),
                peer_urls: m.peer_urls().to_vec(),
                client_urls: m.client_urls().to_vec(),
                learner: m.is_learner(),
                status: health,
            });
        }
        Ok(view)
    }

    async fn add_learner(&self, endpoints: &[String], peer_url: &str) -> Result<u64, MemberOpError> {
        let result = async {
            let mut client = self.client(endpoints, "member add").await?;
            timed(
                "member add",
                client.member_add([peer_url], Some(MemberAddOptions::new().with_is_learner())),
            )
            .await
        }
        .await;
        let resp = self.keep_or_forget(endpoints, result)?;
        Ok(resp.member().map(|m| m.id()).unwrap_or_default())
    }

    async fn promote(&self, endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
        let result = async {
            let mut client = self.client(endpoints, "member promote").await?;
            timed("member promote", client.member_promote(id)).await
        }
        .await;
        self.keep_or_forget(endpoints, result).map(|_| ())
    }

    async fn remove(&self, endpoints: &[String], id: u64) -> Result<(), MemberOpError> {
        let result = async {
            let mut client = self.client(endpoints, "member remove").await?;
            timed("member remove", client.member_remove(id)).await
        }
        .await;
        self.keep_or_forget(endpoints, result).map(|_| ())
    }

    async fn compact(&self, endpoints: &[String]) -> Result<i64, MemberOpError> {
        let result = async {
            // A physical compaction waits until the backend has dropped the old revisions:
            // longer than the cached clients allow on a loaded machine.
            let mut client = self.long_client(endpoints, "compact").await?;
            let head = timed(
                "compact",
                client.get("\0", Some(GetOptions::new().with_count_only())),
            )
            .await?;
            let revision = head.header().map(|h| h.revision()).unwrap_or_default();
            let compacted = tokio::time::timeout(
                DEFRAGMENT_TIMEOUT,
                client.compact(revision, Some(CompactionOptions::new().with_physical())),
            )
            .await
            .map_err(|_| MemberOpError::Timeout {
                op: "compact",
                after: DEFRAGMENT_TIMEOUT,
            })
            .and_then(|r| r.map_err(|e| classify("compact", e)));
            match compacted {
                Ok(_) => Ok(revision),
                // Compacted there already (by etcd's own auto-compaction, or an earlier try).
                Err(MemberOpError::Etcd { ref source, .. })
                    if etcd_errors::classify(source) == EtcdErrorKind::Compacted =>
                {
                    Ok(revision)
                }
                Err(e) => Err(e),
            }
        }
        .await;
        self.keep_or_forget(endpoints, result)
    }

    async fn defragment(&self, endpoint: &str) -> Result<(), MemberOpError> {
        // Its own connection: the cached ones give up after a few seconds, a defragmentation
        // rewrites the member's whole database.
        let mut client = self.long_client(&[endpoint.to_owned()], "defragment").await?;
        match tokio::time::timeout(DEFRAGMENT_TIMEOUT, client.defragment()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(classify("defragment", e)),
            Err(_) => Err(MemberOpError::Timeout {
                op: "defragment",
                after: DEFRAGMENT_TIMEOUT,
            }),
        }
    }

    async fn disarm(&self, endpoints: &[String], alarm: MemberAlarm) -> Result<(), MemberOpError> {
        let kind = match alarm.alarm {
            AlarmKind::NoSpace => AlarmType::Nospace,
            AlarmKind::Corrupt => AlarmType::Corrupt,
        };
        let result = async {
            let mut client = self.client(endpoints, "alarm disarm").await?;
            let mut options = AlarmOptions::new();
            options.with_member(alarm.member);
            timed(
                "alarm disarm",
                client.alarm(AlarmAction::Deactivate, kind, Some(options)),
            )
            .await
        }
        .await;
        self.keep_or_forget(endpoints, result).map(|_| ())
    }

    async fn enable_downgrade(&self, endpoints: &[String], version: &str) -> Result<(), MemberOpError> {
        let result = async {
            let client = self.client(endpoints, "downgrade").await?;
            // Validate first: etcd says why a downgrade cannot be enabled (a member on another
            // version, a target it does not allow) without changing anything.
            timed(
                "downgrade validate",
                client
                    .maintenance_client()
                    .downgrade(DowngradeOptions::Validate(version.to_owned())),
            )
            .await?;
            timed(
                "downgrade enable",
                client
                    .maintenance_client()
                    .downgrade(DowngradeOptions::Enable(version.to_owned())),
            )
            .await
        }
        .await;
        self.keep_or_forget(endpoints, result).map(|_| ())
    }

    async fn move_leader(&self, leader_url: &str, to: u64) -> Result<(), MemberOpError> {
        let endpoints = [leader_url.to_string()];
        let result = async {
            let mut client = self.client(&endpoints, "move leader").await?;
            timed("move leader", client.move_leader(to)).await
        }
        .await;
        self.keep_or_forget(&endpoints, result).map(|_| ())
    }

    async fn snapshot(&self, endpoint: &str) -> Result<Snapshot, SnapshotError> {
        let stream = self.stream_snapshot(endpoint).await?;
        let (revision, taken) = (stream.revision, stream.taken);
        let (data, verified) = stream.collect_bytes().await?;
        Ok(Snapshot {
            data,
            sha256: verified.sha256,
            revision,
            endpoint: endpoint.to_owned(),
            taken,
        })
    }

    async fn snapshot_stream(&self, endpoint: &str) -> Result<SnapshotStream, SnapshotError> {
        self.stream_snapshot(endpoint).await
    }

    async fn save_snapshot(
        &self,
        endpoint: &str,
        dir: &Path,
        prefix: &str,
    ) -> Result<SavedSnapshot, SnapshotError> {
        let write_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SnapshotError::Write { path, source }
        };
        tokio::fs::create_dir_all(dir).await.map_err(write_error(dir))?;
        let stream = self.stream_snapshot(endpoint).await?;
        let revision = stream.revision;
        let path = dir.join(format!("{prefix}-{revision}.db"));
        let verified = crate::member_ops::file::write_snapshot(stream, &path).await?;
        Ok(SavedSnapshot {
            path,
            revision,
            size: verified.size,
            sha256: verified.sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_tests::{EtcdVersion, TestEtcd};

    fn status(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn etcds_not_yet_answers_become_a_type_and_everything_else_stays_an_error() {
        for message in [
            "etcdserver: can only promote a learner member which is in sync with leader",
            "etcdserver: unhealthy cluster",
            "etcdserver: too many learner members in cluster",
            "etcdserver: re-configuration failed due to not enough started members",
        ] {
            let error = classify("member promote", status(tonic::Code::FailedPrecondition, message));
            assert!(error.is_not_ready_yet(), "{message}");
            assert!(!connection_failed(&error));
        }
        for message in [
            "etcdserver: member not found",
            "etcdserver: rpc not supported for learner",
            "etcdserver: Peer URLs already exists",
            "etcdserver: can only promote a learner member", // a prefix is not the answer
        ] {
            let error = classify("member remove", status(tonic::Code::NotFound, message));
            assert!(
                matches!(
                    error,
                    MemberOpError::Etcd {
                        op: "member remove",
                        ..
                    }
                ),
                "{error}"
            );
            assert!(connection_failed(&error), "{error}");
        }
        assert!(connection_failed(&MemberOpError::Timeout {
            op: "status",
            after: CALL_TIMEOUT
        }));
        assert!(!connection_failed(&MemberOpError::NoEndpoint { op: "status" }));
    }

    /// A frozen member (SIGSTOP) accepts connections and never answers. Asked first for the
    /// member list, it costs the hedge delay, not the call timeout; and no alarm list (a raft
    /// request) is asked while no status names an alarm. Regression of the robustness suite's
    /// seed 2027, fault 57: a frozen leader went untold for its whole 8.6 s freeze.
    #[tokio::test]
    async fn a_silent_member_first_in_the_list_costs_a_moment_not_a_call_timeout() {
        let etcd = TestEtcd::start(EtcdVersion::V3_5_1).await.unwrap();
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_url = format!("http://{}", silent.local_addr().unwrap());
        // Accepts and holds every connection without a byte back.
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                connections.push(stream);
            }
        });
        let ops = EtcdClient::default();
        let endpoints = vec![silent_url, etcd.endpoint().to_string()];
        let began = std::time::Instant::now();
        let view = ops.observe(&endpoints).await.expect("the real member answers");
        let took = began.elapsed();
        assert_eq!(view.members.len(), 1);
        assert!(view.members[0].status.is_some());
        assert!(view.alarms.is_empty());
        // Without the hedge the silent member holds the member list for the call timeout.
        assert!(took < CALL_TIMEOUT, "observing took {took:?}");
        held.abort();
    }

    #[tokio::test]
    async fn one_connection_serves_every_call_to_a_member_and_a_dead_one_is_dropped() {
        let etcd = TestEtcd::start(EtcdVersion::V3_5_1).await.unwrap();
        let ops = EtcdClient::default();
        let endpoints = vec![etcd.endpoint().to_string()];
        for _ in 0..3 {
            let view = ops.observe(&endpoints).await.expect("the member answers");
            assert_eq!(view.members.len(), 1);
            assert!(view.members[0].status.is_some());
        }
        assert_eq!(
            ops.cached(),
            1,
            "the member list and status calls share one client"
        );

        let snapshot = ops.snapshot(etcd.endpoint()).await.unwrap();
        assert_eq!(snapshot.sha256, crate::backup_policy::sha256_hex(&snapshot.data));
        let dir = tempfile::tempdir().unwrap();
        let saved = ops
            .save_snapshot(etcd.endpoint(), dir.path(), "pre")
            .await
            .unwrap();
        assert_eq!(saved.path, dir.path().join(format!("pre-{}.db", saved.revision)));
        let on_disk = std::fs::read(&saved.path).unwrap();
        assert_eq!(on_disk.len() as u64, saved.size);
        assert_eq!(crate::backup_policy::sha256_hex(&on_disk), saved.sha256);
        assert_eq!(ops.cached(), 1);

        drop(etcd);
        assert!(ops.observe(&endpoints).await.is_err());
        assert_eq!(ops.cached(), 0, "a connection that failed is not kept");
        // Nothing half-written is left behind by a failed snapshot.
        let err = ops
            .save_snapshot(&endpoints[0], dir.path(), "late")
            .await
            .unwrap_err();
        assert!(matches!(err, SnapshotError::Etcd { .. }), "{err}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn each_identity_gets_its_own_connection_and_plain_endpoints_none() {
        let ops = EtcdClient::default();
        let endpoints = vec!["https://127.0.0.1:1".to_string()];
        let tls = |cert: &str| ClientTls {
            ca_pem: "ca".into(),
            cert_pem: cert.into(),
            key_pem: "key".into(),
        };
        assert_eq!(ops.tls_for(&endpoints), None);
        let plain = ops.key(&endpoints);
        ops.use_tls(&endpoints, Some(&tls("a")));
        assert_eq!(ops.tls_for(&endpoints), Some(tls("a")));
        let a = ops.key(&endpoints);
        ops.use_tls(&endpoints, Some(&tls("b")));
        let b = ops.key(&endpoints);
        assert!(plain != a && a != b && plain != b);
        // A clone shares the registrations (the controller, backups and `/snapshot`).
        assert_eq!(ops.clone().tls_for(&endpoints), Some(tls("b")));
        ops.use_tls(&endpoints, None);
        assert_eq!(ops.key(&endpoints), plain);
    }

    #[test]
    fn a_tls_failure_is_found_in_the_chain_of_causes_however_deep() {
        #[derive(Debug)]
        struct Wrapper(std::io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("transport error")
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let handshake = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = Wrapper(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            handshake.clone(),
        ));
        let io = |e: std::io::Error| etcd_client::Error::IoError(e);
        let tls_failure = etcd_errors::tls_failure;
        assert_eq!(tls_failure(&io(std::io::Error::other(wrapped))), Some(&handshake));
        let direct = std::io::Error::new(std::io::ErrorKind::InvalidData, handshake.clone());
        assert_eq!(tls_failure(&io(direct)), Some(&handshake));
        let refused = Wrapper(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(tls_failure(&io(std::io::Error::other(refused))), None);
        // As etcd-client hands it over: a gRPC status whose source is the transport failure.
        let status = tonic::Status::from_error(Box::new(Wrapper(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            handshake,
        ))));
        let error = classify("member list", etcd_client::Error::GRpcStatus(status));
        assert!(
            matches!(
                error,
                MemberOpError::Tls {
                    op: "member list",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("UnknownIssuer"), "{error}");
        let plain = classify(
            "member list",
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("connection refused")),
        );
        assert!(matches!(plain, MemberOpError::Etcd { .. }), "{plain}");
    }
}
