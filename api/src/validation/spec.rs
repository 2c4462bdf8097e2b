//! Create-time rules of the hub object: metadata and every part of the spec.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::field::{FieldError, FieldWarning, Path};
use super::format;
use crate::v1alpha2::{self as v2, StorageMedium};
use crate::{naming, quantity, versions};

/// Collects errors and warnings while walking an object.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) errors: Vec<FieldError>,
    pub(crate) warnings: Vec<FieldWarning>,
}

impl Report {
    pub(crate) fn error(&mut self, error: FieldError) {
        self.errors.push(error);
    }

    fn warn(&mut self, field: &Path, message: impl Into<String>) {
        self.warnings.push(FieldWarning::new(field, message));
    }

    pub(crate) fn warn_at(&mut self, field: &Path, message: impl Into<String>) {
        self.warn(field, message);
    }

    /// Records one `Invalid` error per message of a format check.
    pub(crate) fn format(&mut self, field: &Path, value: &str, problems: Vec<String>) {
        for problem in problems {
            self.error(FieldError::invalid(field, value, problem));
        }
    }

    fn subdomain(&mut self, field: &Path, value: &str) {
        if value.is_empty() {
            self.error(FieldError::required(field, ""));
        } else {
            self.format(field, value, format::dns1123_subdomain(value));
        }
    }
}

/// Metadata rules: the name is a DNS-1035 label short enough for every child name.
pub(crate) fn metadata(report: &mut Report, meta: &ObjectMeta) {
    let path = Path::root("metadata");
    match meta.name.as_deref() {
        None | Some("") => report.error(FieldError::required(
            &path.child("name"),
            "name or generateName is required",
        )),
        Some(name) => {
            let field = path.child("name");
            if name.len() > naming::MAX_CLUSTER_NAME_LEN {
                report.error(FieldError::invalid(
                    &field,
                    name,
                    format!(
                        "must be no more than {} characters, so that member and volume names stay within 63",
                        naming::MAX_CLUSTER_NAME_LEN
                    ),
                ));
            }
            let problems = format::dns1035_label(name, usize::MAX);
            report.format(&field, name, problems);
        }
    }
    namespace(report, meta);
    labels_and_annotations(report, meta);
}

/// The namespace is a DNS-1123 label. Local mode has no Namespace objects, so this is its whole
/// namespace rule (every resource); serve mode behind the aggregator gets kube-apiserver's too.
pub(crate) fn namespace(report: &mut Report, meta: &ObjectMeta) {
    if let Some(namespace) = meta.namespace.as_deref().filter(|n| !n.is_empty()) {
        report.format(
            &Path::root("metadata").child("namespace"),
            namespace,
            format::dns1123_label(namespace),
        );
    }
}

/// kube-apiserver's rules for `metadata.labels` and `metadata.annotations` of any object
/// (`ValidateObjectMeta`): label keys and annotation keys are qualified names, label values
/// label values, and all annotations together at most 256 KiB.
pub(crate) fn labels_and_annotations(report: &mut Report, meta: &ObjectMeta) {
    let path = Path::root("metadata");
    labels(report, &path.child("labels"), meta.labels.as_ref(), false);
    annotations(report, &path.child("annotations"), meta.annotations.as_ref());
}

/// `ValidateLabels`: every problem of a key or a value is reported at the map's path, as
/// kube-apiserver does (the value of the cause names the offending key or value).
fn labels(report: &mut Report, path: &Path, labels: Option<&BTreeMap<String, String>>, reserved: bool) {
    for (key, value) in labels.into_iter().flatten() {
        report.format(path, key, format::qualified_name(key));
        report.format(path, value, format::label_value(value));
        if reserved && key.starts_with(naming::RESERVED_PREFIX) {
            report.error(FieldError::forbidden(
                &path.key(key),
                format!(
                    "label keys under {} are reserved for the operator",
                    naming::RESERVED_PREFIX
                ),
            ));
        }
    }
}

/// `ValidateAnnotations`: keys are qualified names once lowercased (kube-apiserver accepts
/// `Example.com/Owner`), and keys plus values total at most
/// [`format::TOTAL_ANNOTATION_SIZE_LIMIT`] bytes.
fn annotations(report: &mut Report, path: &Path, annotations: Option<&BTreeMap<String, String>>) {
    let mut total = 0;
    for (key, value) in annotations.into_iter().flatten() {
        report.format(path, key, format::qualified_name(&key.to_lowercase()));
        total += key.len() + value.len();
    }
    if total > format::TOTAL_ANNOTATION_SIZE_LIMIT {
        report.error(FieldError::too_long(path, format::TOTAL_ANNOTATION_SIZE_LIMIT));
    }
}

/// Spec rules.
pub(crate) fn spec(report: &mut Report, spec: &v2::EtcdClusterSpec) {
    let path = Path::root("spec");
    let medium = spec.storage.as_ref().and_then(|s| s.medium.clone());
    replicas(report, &path.child("replicas"), spec.replicas, medium.as_ref());
    if let Some(version) = &spec.version {
        let members = spec.replicas.unwrap_or(v2::DEFAULT_REPLICAS);
        version_field(report, &path.child("version"), version, members);
    }
    if let Some(repository) = &spec.repository {
        report.format(
            &path.child("repository"),
            repository,
            format::image_repository(repository),
        );
    }
    if let Some(template) = &spec.pod_template {
        pod_template(report, &path.child("podTemplate"), template);
    }
    if let Some(storage) = &spec.storage {
        storage_spec(report, &path.child("storage"), storage);
    }
    if let Some(maintenance) = &spec.maintenance {
        maintenance_spec(report, &path.child("maintenance"), maintenance);
    }
    if let Some(replacement) = &spec.replacement {
        replacement_spec(report, &path.child("replacement"), replacement);
    }
    if let Some(tls) = &spec.tls {
        let tls_path = path.child("tls");
        if let Some(client) = &tls.client {
            tls_plane(report, &tls_path.child("client"), client);
        }
        if let Some(peer) = &tls.peer {
            tls_plane(report, &tls_path.child("peer"), peer);
        }
    }
    if let Some(backup) = &spec.backup {
        backup_spec(report, &path.child("backup"), backup);
    }
    if let Some(restore) = spec.bootstrap.as_ref().and_then(|b| b.restore.as_ref()) {
        restore_spec(report, &path.child("bootstrap").child("restore"), restore);
    }
    if spec.paused == Some(true) {
        report.warn(
            &path.child("paused"),
            "the cluster is paused: the operator will not scale, upgrade, repair or back it up",
        );
    }
}

fn replicas(report: &mut Report, path: &Path, replicas: Option<i32>, medium: Option<&StorageMedium>) {
    let Some(n) = replicas else { return };
    if n == 0 && medium == Some(&StorageMedium::Memory) {
        report.error(FieldError::invalid_raw(
            path,
            n,
            "may not be 0 with storage medium Memory: an in-memory cluster keeps its data only in its running members, and scaling to 0 would delete it",
        ));
    } else if !(1..=9).contains(&n) {
        report.error(FieldError::invalid_raw(path, n, "must be between 1 and 9"));
    } else if n == 1 {
        report.warn(
            path,
            "a single member tolerates no failure; use 3 or 5 for production",
        );
    } else if n % 2 == 0 {
        report.warn(
            path,
            format!(
                "an even number of members ({n}) tolerates no more failures than {}; prefer an odd number",
                n - 1
            ),
        );
    }
}

fn version_field(report: &mut Report, path: &Path, version: &str, members: i32) {
    match versions::parse(version) {
        Err(e) => report.error(FieldError::invalid(path, version, e.to_string())),
        Ok(parsed) => {
            for issue in versions::known_issues(&parsed, members) {
                report.warn(path, issue);
            }
        }
    }
}

fn pod_template(report: &mut Report, path: &Path, template: &v2::PodTemplate) {
    if let Some(meta) = &template.metadata {
        let meta_path = path.child("metadata");
        labels(report, &meta_path.child("labels"), meta.labels.as_ref(), true);
        annotations(report, &meta_path.child("annotations"), meta.annotations.as_ref());
    }
    let Some(spec) = &template.spec else { return };
    let spec_path = path.child("spec");
    if let Some(resources) = &spec.resources {
        resource_requirements(report, &spec_path.child("resources"), resources);
    }
    if let Some(selector) = &spec.node_selector {
        labels(report, &spec_path.child("nodeSelector"), Some(selector), false);
    }
    for (i, toleration) in spec.tolerations.iter().flatten().enumerate() {
        toleration_rules(report, &spec_path.child("tolerations").index(i), toleration);
    }
    if let Some(constraints) = &spec.topology_spread_constraints {
        topology_spread(report, &spec_path.child("topologySpreadConstraints"), constraints);
    }
    if let Some(name) = &spec.priority_class_name {
        report.subdomain(&spec_path.child("priorityClassName"), name);
    }
}

fn resource_requirements(report: &mut Report, path: &Path, resources: &ResourceRequirements) {
    let mut parse_all =
        |field: &str,
         list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            let mut parsed = BTreeMap::new();
            for (name, value) in list.into_iter().flatten() {
                let entry = path.child(field).key(name);
                report.format(&path.child(field), name, format::qualified_name(name));
                match quantity::parse(&value.0) {
                    Err(e) => report.error(FieldError::invalid(&entry, &value.0, e.to_string())),
                    Ok(v) if v < 0.0 => {
                        report.error(FieldError::invalid(
                            &entry,
                            &value.0,
                            "must be greater than or equal to 0",
                        ));
                    }
                    Ok(v) => {
                        parsed.insert(name.clone(), v);
                    }
                }
            }
            parsed
        };
    let requests = parse_all("requests", resources.requests.as_ref());
    let limits = parse_all("limits", resources.limits.as_ref());
    for (name, request) in &requests {
        if let Some(limit) = limits.get(name)
            && request > limit
        {
            let raw = resources
                .requests
                .as_ref()
                .and_then(|r| r.get(name))
                .map(|q| q.0.clone())
                .unwrap_or_default();
            report.error(FieldError::invalid(
                &path.child("requests").key(name),
                &raw,
                format!("must be less than or equal to {name} limit"),
            ));
        }
    }
}

fn toleration_rules(report: &mut Report, path: &Path, toleration: &Toleration) {
    let key = toleration.key.as_deref().unwrap_or("");
    let operator = toleration.operator.as_deref().unwrap_or("");
    let effect = toleration.effect.as_deref().unwrap_or("");
    let value = toleration.value.as_deref().unwrap_or("");
    if !key.is_empty() {
        report.format(&path.child("key"), key, format::qualified_name(key));
    }
    if key.is_empty() && operator != "Exists" {
        report.error(FieldError::invalid(
            &path.child("operator"),
            operator,
            "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
        ));
    }
    if toleration.toleration_seconds.is_some() && effect != "NoExecute" {
        report.error(FieldError::invalid(
            &path.child("effect"),
            effect,
            "effect must be 'NoExecute' when `tolerationSeconds` is set",
        ));
    }
    match operator {
        "" | "Equal" => report.format(&path.child("value"), value, format::label_value(value)),
        "Exists" if !value.is_empty() => report.error(FieldError::invalid(
            &path.child("operator"),
            value,
            "value must be empty when `operator` is 'Exists'",
        )),
        "Exists" => {}
        other => report.error(FieldError::not_supported(
            &path.child("operator"),
            other,
            &["Equal", "Exists"],
        )),
    }
    if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        report.error(FieldError::not_supported(
            &path.child("effect"),
            effect,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        ));
    }
}

fn topology_spread(report: &mut Report, path: &Path, constraints: &[TopologySpreadConstraint]) {
    let mut seen = BTreeSet::new();
    for (i, constraint) in constraints.iter().enumerate() {
        let item = path.index(i);
        if constraint.max_skew <= 0 {
            report.error(FieldError::invalid_raw(
                &item.child("maxSkew"),
                constraint.max_skew,
                "must be greater than zero",
            ));
        }
        if constraint.topology_key.is_empty() {
            report.error(FieldError::required(
                &item.child("topologyKey"),
                "can not be empty",
            ));
        } else {
            report.format(
                &item.child("topologyKey"),
                &constraint.topology_key,
                format::qualified_name(&constraint.topology_key),
            );
        }
        let when = constraint.when_unsatisfiable.as_str();
        if !matches!(when, "DoNotSchedule" | "ScheduleAnyway") {
            report.error(FieldError::not_supported(
                &item.child("whenUnsatisfiable"),
                when,
                &["DoNotSchedule", "ScheduleAnyway"],
            ));
        }
        if let Some(min_domains) = constraint.min_domains
            && min_domains < 1
        {
            report.error(FieldError::invalid_raw(
                &item.child("minDomains"),
                min_domains,
                "must be greater than 0",
            ));
        }
        if !seen.insert((constraint.topology_key.clone(), when.to_owned())) {
            report.error(FieldError::duplicate(
                &item.child("{topologyKey, whenUnsatisfiable}"),
                &format!("{}, {}", constraint.topology_key, when),
            ));
        }
    }
}

fn storage_spec(report: &mut Report, path: &Path, storage: &v2::StorageSpec) {
    if let Some(medium) = &storage.medium
        && !medium.is_known()
    {
        report.error(FieldError::not_supported(
            &path.child("medium"),
            medium.as_str(),
            StorageMedium::KNOWN,
        ));
    }
    if let Some(size) = &storage.size {
        match quantity::parse(&size.0) {
            Err(e) => report.error(FieldError::invalid(&path.child("size"), &size.0, e.to_string())),
            Ok(v) if v <= 0.0 => report.error(FieldError::invalid(
                &path.child("size"),
                &size.0,
                "must be greater than zero",
            )),
            Ok(_) => {}
        }
    }
    if let Some(class) = &storage.storage_class_name {
        if storage.medium == Some(StorageMedium::Memory) {
            report.error(FieldError::forbidden(
                &path.child("storageClassName"),
                "may only be set with medium Disk",
            ));
        } else {
            report.subdomain(&path.child("storageClassName"), class);
        }
    }
    if storage.medium == Some(StorageMedium::Memory) {
        report.warn(
            &path.child("medium"),
            "with medium Memory a member's data is lost when its Pod stops; losing a majority at once loses the cluster's data (configure backups)",
        );
    }
}

fn replacement_spec(report: &mut Report, path: &Path, replacement: &v2::ReplacementSpec) {
    if let Some(policy) = &replacement.policy
        && !policy.is_known()
    {
        report.error(FieldError::not_supported(
            &path.child("policy"),
            policy.as_str(),
            v2::ReplacementPolicy::KNOWN,
        ));
    }
    let (low, high) = crate::defaults::REPLACEMENT_AFTER_RANGE;
    for (name, value) in [
        ("unhealthyAfter", &replacement.unhealthy_after),
        ("crashLoopAfter", &replacement.crash_loop_after),
    ] {
        let Some(value) = value else { continue };
        let field = path.child(name);
        match format::duration_seconds(value) {
            Err(e) => report.error(FieldError::invalid(&field, value, e.to_string())),
            #[allow(clippy::cast_precision_loss)]
            Ok(secs) if secs < low as f64 || secs > high as f64 => {
                report.error(FieldError::invalid(&field, value, "must be between 10s and 168h"))
            }
            Ok(_) => {}
        }
    }
}

fn maintenance_spec(report: &mut Report, path: &Path, maintenance: &v2::MaintenanceSpec) {
    if let Some(quota) = &maintenance.quota_backend_bytes {
        let (low, high) = crate::defaults::QUOTA_RANGE;
        let field = path.child("quotaBackendBytes");
        match quantity::parse(&quota.0) {
            Err(e) => report.error(FieldError::invalid(&field, &quota.0, e.to_string())),
            #[allow(clippy::cast_precision_loss)]
            Ok(v) if v < low as f64 || v > high as f64 => report.error(FieldError::invalid(
                &field,
                &quota.0,
                "must be between 16Mi and 8Gi",
            )),
            Ok(_) => {}
        }
    }
    if let Some(defrag) = &maintenance.defragmentation {
        defragmentation_spec(report, &path.child("defragmentation"), defrag);
    }
    let Some(compaction) = &maintenance.auto_compaction else {
        return;
    };
    let path = path.child("autoCompaction");
    if let Some(mode) = &compaction.mode
        && !mode.is_known()
    {
        report.error(FieldError::not_supported(
            &path.child("mode"),
            mode.as_str(),
            v2::AutoCompactionMode::KNOWN,
        ));
    }
    if let Some(retention) = &compaction.retention {
        let revision = compaction.mode == Some(v2::AutoCompactionMode::Revision);
        let ok = if revision {
            retention.parse::<u64>().is_ok()
        } else {
            compaction_period(retention)
        };
        if !ok {
            report.error(FieldError::invalid(
                &path.child("retention"),
                retention,
                if revision {
                    "must be a number of revisions, e.g. 10000"
                } else {
                    "must be a duration such as 1h, 30m or 90s (or a number of hours)"
                },
            ));
        }
    }
}

/// A period etcd's `--auto-compaction-retention` accepts in periodic mode: a number of hours, or
/// a Go duration made of `<number><unit>` parts (`h`, `m`, `s`, `ms`).
fn compaction_period(text: &str) -> bool {
    if text.parse::<u64>().is_ok() {
        return true;
    }
    let mut rest = text;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "h", "m", "s"].iter().find(|u| rest.starts_with(*u));
        let Some(unit) = unit else { return false };
        rest = &rest[unit.len()..];
    }
    true
}

fn tls_plane(report: &mut Report, path: &Path, plane: &v2::TlsPlane) {
    let set = [
        plane.secret_ref.is_some(),
        plane.cert_manager.is_some(),
        plane.auto.is_some(),
    ]
    .into_iter()
    .filter(|b| *b)
    .count();
    match set {
        0 => report.error(FieldError::required(
            path,
            "must specify one of: `secretRef`, `certManager` or `auto`",
        )),
        1 => {}
        _ => report.error(FieldError::forbidden(
            path,
            "may not specify more than 1 of `secretRef`, `certManager` and `auto`",
        )),
    }
    if let Some(secret) = &plane.secret_ref {
        report.subdomain(&path.child("secretRef").child("name"), &secret.name);
    }
    if let Some(cert_manager) = &plane.cert_manager {
        let issuer_path = path.child("certManager").child("issuerRef");
        let issuer = &cert_manager.issuer_ref;
        report.subdomain(&issuer_path.child("name"), &issuer.name);
        let group = issuer.group.as_deref().unwrap_or("cert-manager.io");
        if group != "cert-manager.io" {
            report.subdomain(&issuer_path.child("group"), group);
        }
        if let Some(kind) = issuer.kind.as_deref()
            && group == "cert-manager.io"
            && !matches!(kind, "Issuer" | "ClusterIssuer")
        {
            report.error(FieldError::not_supported(
                &issuer_path.child("kind"),
                kind,
                &["Issuer", "ClusterIssuer"],
            ));
        }
    }
}

/// A cron schedule as the operator evaluates it: five fields, or six with a leading seconds
/// field (schedules finer than a minute).
fn cron_schedule(report: &mut Report, field: &Path, schedule: &str) {
    let parser = croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .year(croner::parser::Year::Disallowed)
        .build();
    if let Err(e) = parser.parse(schedule) {
        report.error(FieldError::invalid(
            field,
            schedule,
            format!(
                "must be a cron expression of five fields (minute hour day-of-month month day-of-week) or six (with a leading seconds field): {e}"
            ),
        ));
    }
}

fn defragmentation_spec(report: &mut Report, path: &Path, defrag: &v2::DefragmentationSpec) {
    if let Some(schedule) = &defrag.schedule {
        let field = path.child("schedule");
        if schedule.trim().is_empty() {
            report.error(FieldError::required(
                &field,
                "a cron schedule such as \"0 3 * * 0\", or leave the field out",
            ));
        } else {
            cron_schedule(report, &field, schedule);
        }
    }
    if let Some(percent) = defrag.fragmentation_percent
        && !(0..=99).contains(&percent)
    {
        report.error(FieldError::invalid(
            &path.child("fragmentationPercent"),
            &percent.to_string(),
            "must be between 0 (size trigger off) and 99",
        ));
    }
    if let Some(min) = &defrag.min_reclaimable_bytes {
        let field = path.child("minReclaimableBytes");
        match quantity::parse(&min.0) {
            Err(e) => report.error(FieldError::invalid(&field, &min.0, e.to_string())),
            #[allow(clippy::cast_precision_loss)]
            Ok(v) if v < 0.0 || v > crate::defaults::MAX_MIN_RECLAIMABLE as f64 => {
                report.error(FieldError::invalid(&field, &min.0, "must be between 0 and 8Gi"))
            }
            Ok(_) => {}
        }
    }
}

fn backup_spec(report: &mut Report, path: &Path, backup: &v2::BackupSpec) {
    let schedule = path.child("schedule");
    if backup.schedule.trim().is_empty() {
        report.error(FieldError::required(
            &schedule,
            "a cron schedule such as \"0 */6 * * *\"",
        ));
    } else {
        cron_schedule(report, &schedule, &backup.schedule);
    }
    if let Some(retention) = &backup.retention {
        let retention_path = path.child("retention");
        if let Some(count) = retention.max_count
            && !(1..=1000).contains(&count)
        {
            report.error(FieldError::invalid_raw(
                &retention_path.child("maxCount"),
                count,
                "must be between 1 and 1000",
            ));
        }
        if let Some(age) = &retention.max_age {
            match format::duration_seconds(age) {
                Err(e) => report.error(FieldError::invalid(
                    &retention_path.child("maxAge"),
                    age,
                    e.to_string(),
                )),
                Ok(seconds) if seconds < 60.0 => {
                    report.error(FieldError::invalid(
                        &retention_path.child("maxAge"),
                        age,
                        "must be at least 1m",
                    ));
                }
                Ok(_) => {}
            }
        }
    }
    destination(report, &path.child("destination"), &backup.destination);
}

pub(crate) fn destination(report: &mut Report, path: &Path, destination: &v2::BackupDestination) {
    match (&destination.s3, &destination.volume) {
        (None, None) => report.error(FieldError::required(
            path,
            "must specify one of: `s3` or `volume`",
        )),
        (Some(_), Some(_)) => {
            report.error(FieldError::forbidden(
                path,
                "may not specify more than 1 of `s3` and `volume`",
            ));
        }
        _ => {}
    }
    if let Some(s3) = &destination.s3 {
        let s3_path = path.child("s3");
        if s3.bucket.is_empty() {
            report.error(FieldError::required(&s3_path.child("bucket"), ""));
        } else {
            report.format(
                &s3_path.child("bucket"),
                &s3.bucket,
                format::s3_bucket(&s3.bucket),
            );
        }
        if let Some(prefix) = &s3.prefix
            && (prefix.starts_with('/') || prefix.split('/').any(|p| p == ".."))
        {
            report.error(FieldError::invalid(
                &s3_path.child("prefix"),
                prefix,
                "must be relative: no leading '/' and no '..'",
            ));
        }
        if let Some(endpoint) = &s3.endpoint {
            report.format(
                &s3_path.child("endpoint"),
                endpoint,
                format::url_with_scheme(endpoint, &["http", "https"]),
            );
        }
        if let Some(region) = &s3.region
            && (region.is_empty()
                || !region
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        {
            report.error(FieldError::invalid(
                &s3_path.child("region"),
                region,
                "must consist of lowercase letters, digits and '-', e.g. eu-west-1",
            ));
        }
        if let Some(secret) = &s3.credentials_secret {
            report.subdomain(&s3_path.child("credentialsSecret"), secret);
        }
    }
    if let Some(volume) = &destination.volume {
        let volume_path = path.child("volume");
        match (&volume.claim_name, &volume.path) {
            (None, None) => {
                report.error(FieldError::required(
                    &volume_path,
                    "must specify one of: `claimName` or `path`",
                ));
            }
            (Some(_), Some(_)) => {
                report.error(FieldError::forbidden(
                    &volume_path,
                    "may not specify more than 1 of `claimName` and `path`",
                ));
            }
            _ => {}
        }
        if let Some(claim) = &volume.claim_name {
            report.subdomain(&volume_path.child("claimName"), claim);
        }
        if let Some(dir) = &volume.path
            && (!dir.starts_with('/') || dir.split('/').any(|p| p == ".."))
        {
            report.error(FieldError::invalid(
                &volume_path.child("path"),
                dir,
                "must be an absolute path without '..'",
            ));
        }
    }
}

fn restore_spec(report: &mut Report, path: &Path, restore: &v2::RestoreSpec) {
    match (&restore.backup_name, &restore.source) {
        (None, None) => report.error(FieldError::required(
            path,
            "must specify one of: `backupName` or `source`",
        )),
        (Some(_), Some(_)) => {
            report.error(FieldError::forbidden(
                path,
                "may not specify more than 1 of `backupName` and `source`",
            ));
        }
        _ => {}
    }
    if let Some(name) = &restore.backup_name {
        report.subdomain(&path.child("backupName"), name);
    }
    let Some(source) = &restore.source else { return };
    let source_path = path.child("source");
    match (&source.key, &source.url) {
        (None, None) => report.error(FieldError::required(
            &source_path,
            "must specify one of: `key` or `url`",
        )),
        (Some(_), Some(_)) => {
            report.error(FieldError::forbidden(
                &source_path,
                "may not specify more than 1 of `key` and `url`",
            ));
        }
        _ => {}
    }
    if let Some(key) = &source.key {
        if key.is_empty() {
            report.error(FieldError::required(&source_path.child("key"), ""));
        }
        match &source.destination {
            None => report.error(FieldError::required(
                &source_path.child("destination"),
                "the store holding `key`",
            )),
            Some(dest) => destination(report, &source_path.child("destination"), dest),
        }
    }
    if let Some(url) = &source.url {
        report.format(
            &source_path.child("url"),
            url,
            format::url_with_scheme(url, &["http", "https", "s3"]),
        );
        if source.destination.is_some() {
            report.error(FieldError::forbidden(
                &source_path.child("destination"),
                "may not be set together with `url`",
            ));
        }
    }
}
