//! When members are due for defragmentation, decided from the record in `status.maintenance`,
//! the schedule, the defragment annotation's time and the clock, so the planner stays free of
//! time; how long since the latest NOSPACE reclaim; and how that record changes when a member
//! was defragmented, space was reclaimed or a requested leader took over. Pure.

use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_operator_api::status::{
    DefragmentationStatus, DefragmentationTrigger, LeaderTransferStatus, MaintenanceStatus,
    SpaceReclaimStatus,
};

use crate::backup_policy::{from_time, to_time, whole_second};
use crate::plan::DefragTrigger;

/// A member defragmented less than this long ago is left alone by the size trigger (a file that
/// stays mostly free after a defragmentation is not defragmented over and over).
pub const DEFRAG_COOLDOWN: Duration = Duration::from_secs(600);

/// What the defragmentation record and the clock say about the members, for the planner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefragDue {
    /// Members the schedule wants defragmented: not defragmented since the schedule's latest
    /// time (which is after the cluster was created).
    pub scheduled: Vec<String>,
    /// Members defragmented within [`DEFRAG_COOLDOWN`].
    pub recent: Vec<String>,
    /// Members the defragment annotation wants defragmented: not defragmented since the time it
    /// names (a time still in the future asks for nothing yet).
    pub requested: Vec<String>,
}

/// The latest defragmentation time of `member` in the record.
fn last_of(record: Option<&MaintenanceStatus>, member: &str) -> Option<DateTime<Utc>> {
    record?
        .defragmentations
        .iter()
        .find(|d| d.member == member)
        .and_then(|d| d.time.as_ref())
        .and_then(from_time)
}

/// Which of `members` are due. The schedule's latest occurrence at or before `now` counts only
/// when it is after `created`; every member not defragmented since then is due, so a pass
/// interrupted by an operator restart resumes with the members it had not reached, and times
/// missed while the operator was down are made up for once.
pub fn due(
    schedule: Option<&croner::Cron>,
    requested: Option<DateTime<Utc>>,
    created: DateTime<Utc>,
    record: Option<&MaintenanceStatus>,
    members: &[String],
    now: DateTime<Utc>,
) -> DefragDue {
    let requested = requested.filter(|at| *at <= now);
    // Searched from the whole second: croner keeps the sub-second part of the time it searches
    // from, and the record keeps whole seconds, so a member defragmented in the first second of
    // a slot would look defragmented before it.
    let slot = schedule
        .and_then(|cron| cron.find_previous_occurrence(&whole_second(now), true).ok())
        .filter(|slot| *slot > created);
    let cooldown = chrono::Duration::from_std(DEFRAG_COOLDOWN).unwrap_or(chrono::Duration::zero());
    let mut out = DefragDue::default();
    for member in members {
        let last = last_of(record, member);
        if let Some(slot) = slot
            && last.is_none_or(|t| t < slot)
        {
            out.scheduled.push(member.clone());
        }
        if let Some(at) = requested
            && last.is_none_or(|t| t < at)
        {
            out.requested.push(member.clone());
        }
        if last.is_some_and(|t| now - t < cooldown) {
            out.recent.push(member.clone());
        }
    }
    out
}

/// How long until the schedule's next occurrence, to look again then.
pub fn until_next(schedule: &croner::Cron, now: DateTime<Utc>) -> Option<Duration> {
    let next = schedule.find_next_occurrence(&whole_second(now), false).ok()?;
    (next - now).to_std().ok()
}

/// The newer of two records, member by member (this process's own record may be newer than the
/// status it watched).
pub fn merge(a: Option<&MaintenanceStatus>, b: Option<&MaintenanceStatus>) -> Option<MaintenanceStatus> {
    let (mut merged, other) = match (a, b) {
        (None, None) => return None,
        (Some(one), None) | (None, Some(one)) => return Some(one.clone()),
        (Some(a), Some(b)) => (a.clone(), b),
    };
    let time = |d: &DefragmentationStatus| d.time.as_ref().and_then(from_time);
    for theirs in &other.defragmentations {
        match merged
            .defragmentations
            .iter_mut()
            .find(|d| d.member == theirs.member)
        {
            Some(ours) if time(ours) >= time(theirs) => {}
            Some(ours) => *ours = theirs.clone(),
            None => merged.defragmentations.push(theirs.clone()),
        }
    }
    merged.defragmentations.sort_by(|a, b| a.member.cmp(&b.member));
    let reclaimed = |r: &SpaceReclaimStatus| r.time.as_ref().and_then(from_time);
    if let Some(theirs) = &other.last_space_reclaim
        && merged
            .last_space_reclaim
            .as_ref()
            .is_none_or(|ours| reclaimed(ours) < reclaimed(theirs))
    {
        merged.last_space_reclaim = Some(theirs.clone());
    }
    let transferred = |t: &LeaderTransferStatus| t.time.as_ref().and_then(from_time);
    if let Some(theirs) = &other.last_leader_transfer
        && merged
            .last_leader_transfer
            .as_ref()
            .is_none_or(|ours| transferred(ours) < transferred(theirs))
    {
        merged.last_leader_transfer = Some(theirs.clone());
    }
    merged.last_defragmentation = merged
        .defragmentations
        .iter()
        .filter_map(|d| d.time.as_ref().and_then(from_time))
        .max()
        .map(to_time);
    Some(merged)
}

/// The record after `member` was defragmented at `now`, its database having been `db_size`
/// bytes with `in_use` of them in use.
pub fn record(
    previous: Option<&MaintenanceStatus>,
    member: &str,
    trigger: DefragTrigger,
    db_size: u64,
    in_use: u64,
    now: DateTime<Utc>,
) -> MaintenanceStatus {
    let entry = DefragmentationStatus {
        member: member.to_owned(),
        time: Some(to_time(now)),
        trigger: Some(match trigger {
            DefragTrigger::Schedule => DefragmentationTrigger::Schedule,
            DefragTrigger::Fragmentation => DefragmentationTrigger::Fragmentation,
            DefragTrigger::Requested => DefragmentationTrigger::Requested,
        }),
        db_size_before: i64::try_from(db_size).ok(),
        db_size_in_use_before: i64::try_from(in_use).ok(),
    };
    let mut status = previous.cloned().unwrap_or_default();
    status.defragmentations.retain(|d| d.member != member);
    status.defragmentations.push(entry);
    status.defragmentations.sort_by(|a, b| a.member.cmp(&b.member));
    status.last_defragmentation = Some(to_time(now));
    status
}

/// The record after space was reclaimed for NOSPACE at `now` (`reclaim` without its time).
pub fn record_reclaim(
    previous: Option<&MaintenanceStatus>,
    reclaim: SpaceReclaimStatus,
    now: DateTime<Utc>,
) -> MaintenanceStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.last_space_reclaim = Some(SpaceReclaimStatus {
        time: Some(to_time(now)),
        ..reclaim
    });
    status
}

/// How far ahead of this clock a recorded time may be (another replica's clock) and still count.
const CLOCK_SKEW: chrono::Duration = chrono::Duration::seconds(60);

/// How long ago the record's latest NOSPACE reclaim finished (`None`: none recorded, or
/// recorded more than a minute in this clock's future, which no skew explains: it would hold
/// reclaims off for as long; a time a little ahead counts as just now).
pub fn since_reclaim(record: Option<&MaintenanceStatus>, now: DateTime<Utc>) -> Option<Duration> {
    let at = record?
        .last_space_reclaim
        .as_ref()?
        .time
        .as_ref()
        .and_then(from_time)?;
    if at > now + CLOCK_SKEW {
        return None;
    }
    Some((now - at).to_std().unwrap_or(Duration::ZERO))
}

/// The record after the member a move-leader request named was seen leading at `now`.
pub fn record_leader_transfer(
    previous: Option<&MaintenanceStatus>,
    request: &crate::validated::LeaderRequest,
    now: DateTime<Utc>,
) -> MaintenanceStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.last_leader_transfer = Some(LeaderTransferStatus {
        request: request.request.clone(),
        leader: request.member.clone(),
        time: Some(to_time(now)),
    });
    status
}

/// The record without members that are gone (`members`: the current ones).
pub fn retain_members(record: Option<MaintenanceStatus>, members: &[String]) -> Option<MaintenanceStatus> {
    let mut record = record?;
    record.defragmentations.retain(|d| members.contains(&d.member));
    Some(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 25, h, m, 0).unwrap()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn cron(text: &str) -> croner::Cron {
        crate::backup_policy::parse_schedule(text).unwrap()
    }

    #[test]
    fn the_schedule_wants_every_member_not_defragmented_since_its_latest_time() {
        let daily = cron("0 3 * * *");
        let members = names(&["a", "b", "c"]);
        // Nothing recorded yet: at 03:30 the 03:00 pass is due for everyone.
        let d = due(Some(&daily), None, at(1, 0), None, &members, at(3, 30));
        assert_eq!(d.scheduled, members);
        assert!(d.recent.is_empty());
        // A cluster created after the latest time waits for the next one.
        let d = due(Some(&daily), None, at(3, 10), None, &members, at(3, 30));
        assert!(d.scheduled.is_empty(), "{d:?}");
        // Half way through the pass (an operator restart in between): the rest is due; what was
        // done at 03:20 is recent, so the size trigger leaves it alone too.
        let rec = record(None, "a", DefragTrigger::Schedule, 100, 50, at(3, 20));
        let d = due(Some(&daily), None, at(1, 0), Some(&rec), &members, at(3, 25));
        assert_eq!(d.scheduled, names(&["b", "c"]));
        assert_eq!(d.recent, names(&["a"]));
        // Without a schedule nothing is scheduled; the cooldown passes.
        let d = due(None, None, at(1, 0), Some(&rec), &members, at(3, 40));
        assert_eq!(d, DefragDue::default());
    }

    #[test]
    fn a_member_defragmented_in_the_first_second_of_its_slot_is_not_due_again_in_that_slot() {
        // Status times are whole seconds and the clock is not: a member defragmented at 35.04 s
        // is recorded at 35 s, and the slot of 35 s must count that as done, however late in
        // the slot (and in its first second) the next reconcile looks. Found by the robustness
        // suite (seed 2027): one member defragmented four times in 0.7 s on a `*/5` schedule.
        let every5 = cron("*/5 * * * * *");
        let members = names(&["a", "b"]);
        let slot = Utc.with_ymd_and_hms(2026, 11, 27, 0, 45, 35).unwrap();
        let done = slot + chrono::Duration::milliseconds(40);
        let rec = record(None, "a", DefragTrigger::Schedule, 100, 50, done);
        for later_ms in [41, 320, 999, 1_300, 4_900] {
            let now = slot + chrono::Duration::milliseconds(later_ms);
            let d = due(Some(&every5), None, at(0, 0), Some(&rec), &members, now);
            assert_eq!(d.scheduled, names(&["b"]), "{later_ms} ms after the slot");
        }
        // The schedule is looked at again at the next slot itself, not a fraction after it.
        let wait = until_next(&every5, slot + chrono::Duration::milliseconds(4_900));
        assert_eq!(wait, Some(std::time::Duration::from_millis(100)));
        // The next slot wants it again.
        let next = slot + chrono::Duration::milliseconds(5_200);
        let d = due(Some(&every5), None, at(0, 0), Some(&rec), &members, next);
        assert_eq!(d.scheduled, members);
    }

    #[test]
    fn a_request_wants_every_member_not_defragmented_since_its_time_and_only_once_it_has_come() {
        let members = names(&["a", "b", "c"]);
        let rec = record(None, "a", DefragTrigger::Schedule, 100, 50, at(3, 20));
        // Asked at 03:10: a (done at 03:20) is not due, b and c (never done) are.
        let d = due(None, Some(at(3, 10)), at(1, 0), Some(&rec), &members, at(3, 30));
        assert_eq!(d.requested, names(&["b", "c"]));
        assert!(d.scheduled.is_empty());
        // Asked at 03:25: everyone, the member done before included.
        let d = due(None, Some(at(3, 25)), at(1, 0), Some(&rec), &members, at(3, 30));
        assert_eq!(d.requested, members);
        // A time still to come asks for nothing yet.
        let d = due(None, Some(at(4, 0)), at(1, 0), Some(&rec), &members, at(3, 30));
        assert!(d.requested.is_empty());
        // Recorded as Requested, and done once the member is defragmented after the time.
        let done = record(Some(&rec), "b", DefragTrigger::Requested, 10, 5, at(3, 31));
        let b = done.defragmentations.iter().find(|d| d.member == "b").unwrap();
        assert_eq!(b.trigger, Some(DefragmentationTrigger::Requested));
        let d = due(None, Some(at(3, 10)), at(1, 0), Some(&done), &members, at(3, 32));
        assert_eq!(d.requested, names(&["c"]));
    }

    #[test]
    fn a_leader_transfer_is_recorded_and_kept_by_merges() {
        let request = crate::validated::LeaderRequest {
            request: "b@1".into(),
            member: "b".into(),
        };
        let rec = record_leader_transfer(None, &request, at(3, 0));
        let t = rec.last_leader_transfer.clone().unwrap();
        assert_eq!((t.request.as_str(), t.leader.as_str()), ("b@1", "b"));
        let other = record(None, "a", DefragTrigger::Schedule, 10, 5, at(3, 5));
        assert_eq!(
            merge(Some(&other), Some(&rec)).unwrap().last_leader_transfer,
            Some(t.clone())
        );
        assert_eq!(
            merge(Some(&rec), Some(&other)).unwrap().last_leader_transfer,
            Some(t)
        );
        // The newer record wins, whichever side it comes from.
        let newer = record_leader_transfer(
            Some(&rec),
            &crate::validated::LeaderRequest {
                request: "c@2".into(),
                member: "c".into(),
            },
            at(4, 0),
        );
        for merged in [merge(Some(&rec), Some(&newer)), merge(Some(&newer), Some(&rec))] {
            assert_eq!(merged.unwrap().last_leader_transfer.unwrap().request, "c@2");
        }
    }

    #[test]
    fn a_defragmentation_before_the_latest_time_does_not_count_for_it() {
        let daily = cron("0 3 * * *");
        let rec = record(None, "a", DefragTrigger::Fragmentation, 100, 50, at(2, 59));
        let d = due(Some(&daily), None, at(1, 0), Some(&rec), &names(&["a"]), at(3, 1));
        assert_eq!(d.scheduled, names(&["a"]));
        assert_eq!(until_next(&daily, at(3, 1)), Some(Duration::from_secs(86_340)));
    }

    #[test]
    fn records_keep_the_newest_per_member_and_drop_gone_members() {
        let one = record(None, "a", DefragTrigger::Schedule, 10, 5, at(3, 0));
        let two = record(Some(&one), "b", DefragTrigger::Fragmentation, 20, 5, at(3, 5));
        assert_eq!(two.defragmentations.len(), 2);
        assert_eq!(two.last_defragmentation, Some(to_time(at(3, 5))));
        let newer_a = record(None, "a", DefragTrigger::Schedule, 10, 5, at(4, 0));
        let merged = merge(Some(&two), Some(&newer_a)).unwrap();
        let a = merged.defragmentations.iter().find(|d| d.member == "a").unwrap();
        assert_eq!(a.time, Some(to_time(at(4, 0))));
        assert_eq!(merged.last_defragmentation, Some(to_time(at(4, 0))));
        assert_eq!(merge(Some(&newer_a), Some(&two)), Some(merged.clone()));
        let kept = retain_members(Some(merged), &names(&["b"])).unwrap();
        assert_eq!(kept.defragmentations.len(), 1);
        assert_eq!(kept.defragmentations[0].member, "b");
        assert_eq!(retain_members(None, &names(&["b"])), None);
    }

    #[test]
    fn a_reclaim_is_recorded_kept_when_newer_and_counted_from() {
        let reclaim = |rev: i64| SpaceReclaimStatus {
            compacted_revision: Some(rev),
            defragmented: names(&["b", "a"]),
            disarmed: names(&["a"]),
            ..SpaceReclaimStatus::default()
        };
        assert_eq!(since_reclaim(None, at(3, 0)), None);
        let defrag = record(None, "a", DefragTrigger::Schedule, 10, 5, at(2, 0));
        assert_eq!(since_reclaim(Some(&defrag), at(3, 0)), None);
        // Recorded beside the defragmentations, stamped with the caller's time.
        let first = record_reclaim(Some(&defrag), reclaim(7), at(3, 0));
        assert_eq!(first.defragmentations, defrag.defragmentations);
        let r = first.last_space_reclaim.clone().unwrap();
        assert_eq!(r.time, Some(to_time(at(3, 0))));
        assert_eq!(
            (r.compacted_revision, r.disarmed.clone()),
            (Some(7), names(&["a"]))
        );
        assert_eq!(
            since_reclaim(Some(&first), at(3, 5)),
            Some(Duration::from_secs(300))
        );
        // A little ahead (another replica's clock): just now. Far ahead: not believed.
        let just_before = at(3, 0) - chrono::Duration::seconds(30);
        assert_eq!(since_reclaim(Some(&first), just_before), Some(Duration::ZERO));
        assert_eq!(since_reclaim(Some(&first), at(2, 55)), None);
        // Merging keeps the newer reclaim whichever side has it; defragmentations still merge.
        let second = record_reclaim(None, reclaim(9), at(3, 10));
        let merged = merge(Some(&first), Some(&second)).unwrap();
        assert_eq!(merged.last_space_reclaim, second.last_space_reclaim);
        assert_eq!(merged.defragmentations, defrag.defragmentations);
        let merged = merge(Some(&second), Some(&first)).unwrap();
        assert_eq!(merged.last_space_reclaim, second.last_space_reclaim);
        // Gone members do not take the reclaim record with them.
        let kept = retain_members(Some(merged), &names(&["z"])).unwrap();
        assert!(kept.defragmentations.is_empty());
        assert_eq!(kept.last_space_reclaim, second.last_space_reclaim);
    }
}
