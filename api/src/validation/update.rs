//! Update-time rules: how the version may move, and which fields are immutable.

use super::field::{FieldError, Path};
use super::spec::Report;
use crate::defaults::effective_storage;
use crate::v1alpha2 as v2;
use crate::versions::{self, DEFAULT_ETCD_VERSION, Transition};

const IMMUTABLE: &str = "field is immutable";

pub(crate) fn changes(report: &mut Report, new: &v2::EtcdClusterSpec, old: &v2::EtcdClusterSpec) {
    let path = Path::root("spec");
    version_change(report, &path.child("version"), new, old);

    let (new_storage, old_storage) = (effective_storage(new), effective_storage(old));
    if new_storage.medium != old_storage.medium {
        let value = new_storage
            .medium
            .as_ref()
            .map(|m| m.as_str().to_owned())
            .unwrap_or_default();
        report.errors.push(FieldError::invalid(
            &path.child("storage").child("medium"),
            &value,
            IMMUTABLE,
        ));
    } else if new_storage.storage_class_name != old_storage.storage_class_name {
        report.errors.push(FieldError::invalid(
            &path.child("storage").child("storageClassName"),
            new_storage.storage_class_name.as_deref().unwrap_or_default(),
            IMMUTABLE,
        ));
    } else if new_storage.size != old_storage.size {
        size_change(
            report,
            &path.child("storage").child("size"),
            &new_storage,
            &old_storage,
        );
    } else if new_storage != old_storage {
        report
            .errors
            .push(FieldError::forbidden(&path.child("storage"), IMMUTABLE));
    }

    if normalized_tls(new.tls.as_deref()) != normalized_tls(old.tls.as_deref()) {
        report
            .errors
            .push(FieldError::forbidden(&path.child("tls"), IMMUTABLE));
    }
    if normalized_bootstrap(new.bootstrap.as_deref()) != normalized_bootstrap(old.bootstrap.as_deref()) {
        report
            .errors
            .push(FieldError::forbidden(&path.child("bootstrap"), IMMUTABLE));
    }
}

/// `spec.storage.size` may grow (each member's volume is expanded), never shrink: no volume
/// gives space back, and etcd's data may already use it.
fn size_change(report: &mut Report, path: &Path, new: &v2::StorageSpec, old: &v2::StorageSpec) {
    let bytes = |s: &v2::StorageSpec| s.size.as_ref().and_then(|q| crate::quantity::parse(&q.0).ok());
    let value = new.size.as_ref().map(|q| q.0.clone()).unwrap_or_default();
    // A malformed new size is reported by the create rules; an old one stored under older
    // rules can be replaced by anything valid.
    let (Some(to), Some(from)) = (bytes(new), bytes(old)) else {
        return;
    };
    if to < from {
        let was = old.size.as_ref().map(|q| q.0.as_str()).unwrap_or_default();
        report.errors.push(FieldError::invalid(
            path,
            &value,
            format!("may only grow (it is {was}): a volume cannot give space back"),
        ));
    } else if to > from {
        report.warn_at(
            path,
            format!(
                "growing the members' volumes to {value}: each claim is expanded (its StorageClass must allow volume expansion), and the default backend quota follows"
            ),
        );
    }
}

fn version_change(report: &mut Report, path: &Path, new: &v2::EtcdClusterSpec, old: &v2::EtcdClusterSpec) {
    let new_version = new.version.as_deref().unwrap_or(DEFAULT_ETCD_VERSION);
    let old_version = old.version.as_deref().unwrap_or(DEFAULT_ETCD_VERSION);
    // A malformed new version is reported by the create rules; a malformed old one (stored
    // under older rules) can only be replaced.
    let (Ok(to), Ok(from)) = (versions::parse(new_version), versions::parse(old_version)) else {
        return;
    };
    match versions::check_transition(&from, &to) {
        Err(e) => report.errors.push(FieldError::invalid(path, new_version, e.to_string())),
        Ok(Transition::MinorUpgrade) => report.warn_at(
            path,
            format!("upgrading from {from} to {to}: members restart on it one at a time on their data, the leader last; a snapshot is taken first"),
        ),
        // etcd moves 3.6 to 3.5 only through its downgrade API: the controller validates and
        // enables it (the cluster and storage versions go to 3.5), then rolls every member onto
        // the 3.5 binary in the upgrade order (docs/upgrades.md).
        Ok(Transition::MinorDowngrade) => report.warn_at(
            path,
            format!(
                "downgrading from {from} to {to}: a snapshot is taken, etcd's downgrade is validated and enabled (the cluster and storage versions become {}.{}), then members restart on {to} one at a time, the leader last",
                to.major, to.minor
            ),
        ),
        Ok(_) => {}
    }
}

fn normalized_tls(tls: Option<&v2::TlsSpec>) -> Option<&v2::TlsSpec> {
    tls.filter(|t| t.client.is_some() || t.peer.is_some())
}

fn normalized_bootstrap(bootstrap: Option<&v2::BootstrapSpec>) -> Option<&v2::RestoreSpec> {
    bootstrap.and_then(|b| b.restore.as_ref())
}
