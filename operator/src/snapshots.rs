//! The `/snapshot` subresource's source of snapshots: the controller's member connections
//! ([`EtcdClient`]) and its choice of member (a healthy follower first, the next one when a member
//! fails to start streaming), injected into the API server, which knows no controller code.

use etcd_operator_apiserver::http::snapshot::{
    MemberSnapshot, OpenSnapshotError, SnapshotSource, VerifiedSnapshot,
};
use etcd_operator_controller::backup::snapshot::{self, SnapshotError};
use etcd_operator_controller::member_ops::EtcdClient;
use futures::StreamExt;
use futures::future::BoxFuture;

/// Snapshots taken through the controller's member connections.
#[derive(Clone, Default)]
pub struct MemberSnapshots {
    members: EtcdClient,
}

impl MemberSnapshots {
    /// Snapshots through `members` (shared with the controller and the backups).
    pub fn new(members: EtcdClient) -> Self {
        Self { members }
    }
}

impl std::fmt::Debug for MemberSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberSnapshots").finish_non_exhaustive()
    }
}

impl SnapshotSource for MemberSnapshots {
    fn open<'a>(
        &'a self,
        endpoints: &'a [String],
    ) -> BoxFuture<'a, Result<MemberSnapshot, OpenSnapshotError>> {
        Box::pin(async move {
            let stream = snapshot::open(&self.members, endpoints)
                .await
                .map_err(|e| match e {
                    SnapshotError::NoHealthyMember { .. } => OpenSnapshotError::NoHealthyMember,
                    other => OpenSnapshotError::Member(Box::new(other)),
                })?;
            let verified = stream.verified_handle();
            Ok(MemberSnapshot {
                revision: stream.revision,
                endpoint: stream.endpoint.clone(),
                chunks: stream.map(|chunk| chunk.map_err(Into::into)).boxed(),
                verified: Box::new(move || {
                    verified.get().map(|v| VerifiedSnapshot {
                        size: v.size,
                        sha256: v.sha256.clone(),
                    })
                }),
            })
        })
    }
}
