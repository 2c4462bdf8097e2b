//! jemalloc's own account of the process's memory at `/metrics`, and the options built into it.
//!
//! RSS alone does not say whether memory is live objects or pages the allocator keeps: these
//! series do (read on each scrape, after advancing jemalloc's statistics epoch). `allocated` is
//! what the program holds; `active` the pages of the runs those allocations sit in (the rest of
//! an active page is fragmentation); `resident` what jemalloc has in RAM, its `metadata`
//! included (above `active`: dirty pages not purged yet); `mapped` and `retained` are address
//! space, mapped and given back respectively (retained pages are not in RSS).
//!
//! The decay options (how soon freed pages leave RSS) are built into jemalloc from
//! `JEMALLOC_SYS_WITH_MALLOC_CONF` in `.cargo/config.toml`, without an `unsafe` `malloc_conf`
//! export; [`built_in_config`] reads them back (docs/performance.md).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use tikv_jemalloc_ctl::{epoch, stats};

/// The options string built into jemalloc (jemalloc's `config.malloc_conf`), or `""` where it
/// cannot be read.
pub fn built_in_config() -> &'static str {
    tikv_jemalloc_ctl::config::malloc_conf::read().map_or("", |c| c.trim_end_matches('\0'))
}

/// One series: its name (before `_bytes`), its help, and how to read it.
type Figure = (
    &'static str,
    &'static str,
    fn() -> tikv_jemalloc_ctl::Result<usize>,
);

/// What is exported, in jemalloc's terms (`stats.*`).
const FIGURES: [Figure; 6] = [
    (
        "jemalloc_allocated",
        "Bytes the process holds in allocations (jemalloc stats.allocated).",
        stats::allocated::read,
    ),
    (
        "jemalloc_active",
        "Bytes in the pages those allocations occupy (jemalloc stats.active).",
        stats::active::read,
    ),
    (
        "jemalloc_resident",
        "Bytes of jemalloc's pages resident in RAM, metadata and unpurged free pages included (jemalloc stats.resident).",
        stats::resident::read,
    ),
    (
        "jemalloc_mapped",
        "Bytes in jemalloc's mapped extents (jemalloc stats.mapped).",
        stats::mapped::read,
    ),
    (
        "jemalloc_retained",
        "Bytes of address space jemalloc retained after purging: not resident (jemalloc stats.retained).",
        stats::retained::read,
    ),
    (
        "jemalloc_metadata",
        "Bytes of jemalloc's own metadata (jemalloc stats.metadata).",
        stats::metadata::read,
    ),
];

/// The jemalloc series, read on each scrape.
#[derive(Debug, Clone, Copy, Default)]
pub struct JemallocStats;

impl JemallocStats {
    /// Registers the series in `registry` under the `etcd_operator_` prefix.
    pub fn register(registry: &mut Registry) {
        registry
            .sub_registry_with_prefix("etcd_operator")
            .register_collector(Box::new(JemallocStats));
    }

    /// The current figures, by series name (without prefix and unit); nothing if jemalloc's
    /// statistics cannot be refreshed.
    pub fn read() -> Vec<(&'static str, usize)> {
        if epoch::advance().is_err() {
            return Vec::new();
        }
        FIGURES
            .iter()
            .filter_map(|(name, _, read)| read().ok().map(|v| (*name, v)))
            .collect()
    }
}

impl Collector for JemallocStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, value) in Self::read() {
            let help = FIGURES
                .iter()
                .find(|(n, _, _)| *n == name)
                .map_or("", |(_, help, _)| help);
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, Some(&Unit::Bytes), gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// jemalloc serves this test binary's allocations too, as the server's.
    #[global_allocator]
    static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

    /// The options of `.cargo/config.toml` reached jemalloc's build: without them freed pages
    /// stay in RSS for jemalloc's default 10 s, in four arenas per CPU (docs/performance.md).
    #[test]
    fn decay_options_are_built_in() {
        let config = built_in_config();
        for option in [
            "background_thread:true",
            "dirty_decay_ms:",
            "muzzy_decay_ms:0",
            "narenas:",
        ] {
            assert!(
                config.contains(option),
                "jemalloc was built without {option:?} (config.malloc_conf {config:?}); is \
                 JEMALLOC_SYS_WITH_MALLOC_CONF in .cargo/config.toml?"
            );
        }
    }

    /// The series are served, with live figures: what a program holds is at most what its
    /// pages hold.
    #[test]
    fn series_are_exported() {
        let held = vec![7u8; 1 << 20];
        let figures = JemallocStats::read();
        let get = |name: &str| figures.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        let (Some(allocated), Some(active), Some(resident)) = (
            get("jemalloc_allocated"),
            get("jemalloc_active"),
            get("jemalloc_resident"),
        ) else {
            panic!("missing figures: {figures:?}");
        };
        assert!(
            allocated > 0 && allocated <= active && active <= resident,
            "{figures:?}"
        );
        drop(held);

        let mut registry = Registry::default();
        JemallocStats::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "etcd_operator_jemalloc_allocated_bytes ",
            "etcd_operator_jemalloc_resident_bytes ",
            "etcd_operator_jemalloc_retained_bytes ",
        ] {
            assert!(text.contains(name), "{name} not in:\n{text}");
        }
    }
}
