use std::sync::Arc;

use maplit::btreeset;
use pretty_assertions::assert_eq;

use crate::core::ServerState;
use crate::engine::testing::UTConfig;
use crate::engine::Command;
use crate::engine::Engine;
use crate::entry::RaftEntry;
use crate::error::RejectAppendEntries;
use crate::raft::AppendEntriesRequest;
use crate::raft_state::LogStateReader;
use crate::testing::blank_ent;
use crate::testing::log_id;
use crate::utime::UTime;
use crate::EffectiveMembership;
use crate::Entry;
use crate::Membership;
use crate::MembershipState;
use crate::TokioInstant;
use crate::Vote;

fn m01() -> Membership<u64, ()> {
    Membership::<u64, ()>::new(vec![btreeset! {0,1}], None)
}

fn m23() -> Membership<u64, ()> {
    Membership::<u64, ()>::new(vec![btreeset! {2,3}], None)
}

fn m34() -> Membership<u64, ()> {
    Membership::<u64, ()>::new(vec![btreeset! {3,4}], None)
}

fn eng() -> Engine<UTConfig> {
    let mut eng = Engine::default();
    eng.state.enable_validation(false); // Disable validation for incomplete state

    eng.config.id = 2;
    eng.state.vote = UTime::new(TokioInstant::now(), Vote::new(2, 1));
    eng.state.log_ids.append(log_id(1, 1, 1));
    eng.state.log_ids.append(log_id(2, 1, 3));
    eng.state.committed = Some(log_id(0, 1, 0));
    eng.state.membership_state = MembershipState::new(
        Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
        Arc::new(EffectiveMembership::new(Some(log_id(2, 1, 3)), m23())),
    );
    eng.state.server_state = eng.calc_server_state();
    eng
}

#[test]
fn test_append_entries_vote_is_rejected() -> anyhow::Result<()> {
    let mut eng = eng();

    let res = eng.append_entries(&Vote::new(1, 1), None, Vec::<Entry<UTConfig>>::new());

    assert_eq!(Err(RejectAppendEntries::ByVote(Vote::new(2, 1))), res);
    assert_eq!(
        &[
            log_id(1, 1, 1), //
            log_id(2, 1, 3),
        ],
        eng.state.log_ids.key_log_ids()
    );
    assert_eq!(Vote::new(2, 1), *eng.state.vote_ref());
    assert_eq!(Some(&log_id(2, 1, 3)), eng.state.last_log_id());
    assert_eq!(
        MembershipState::new(
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
            Arc::new(EffectiveMembership::new(Some(log_id(2, 1, 3)), m23())),
        ),
        eng.state.membership_state
    );
    assert_eq!(ServerState::Follower, eng.state.server_state);
    assert_eq!(0, eng.output.take_commands().len());

    Ok(())
}

#[test]
fn test_append_entries_prev_log_id_is_applied() -> anyhow::Result<()> {
    // An applied log id has to be committed thus
    let mut eng = eng();
    eng.state.vote = UTime::new(TokioInstant::now(), Vote::new(1, 2));
    eng.output.take_commands();

    let res = eng.append_entries(
        &Vote::new_committed(2, 1),
        Some(log_id(0, 1, 0)),
        Vec::<Entry<UTConfig>>::new(),
    );

    assert_eq!(Ok(()), res);
    assert_eq!(
        &[
            log_id(1, 1, 1), //
            log_id(2, 1, 3), //
        ],
        eng.state.log_ids.key_log_ids()
    );
    assert_eq!(Vote::new_committed(2, 1), *eng.state.vote_ref());
    assert_eq!(Some(&log_id(2, 1, 3)), eng.state.last_log_id());
    assert_eq!(
        MembershipState::new(
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
            Arc::new(EffectiveMembership::new(Some(log_id(2, 1, 3)), m23())),
        ),
        eng.state.membership_state
    );
    assert_eq!(ServerState::Follower, eng.state.server_state);
    assert_eq!(
        vec![Command::SaveVote {
            vote: Vote::new_committed(2, 1)
        },],
        eng.output.take_commands()
    );

    Ok(())
}

#[test]
fn test_append_entries_prev_log_id_conflict() -> anyhow::Result<()> {
    let mut eng = eng();

    let res = eng.append_entries(
        &Vote::new_committed(2, 1),
        Some(log_id(2, 1, 2)),
        Vec::<Entry<UTConfig>>::new(),
    );

    assert_eq!(
        Err(RejectAppendEntries::ByConflictingLogId {
            expect: log_id(2, 1, 2),
            local: Some(log_id(1, 1, 2)),
        }),
        res
    );
    assert_eq!(
        &[
            log_id(1, 1, 1), //
        ],
        eng.state.log_ids.key_log_ids()
    );
    assert_eq!(Vote::new_committed(2, 1), *eng.state.vote_ref());
    assert_eq!(Some(&log_id(1, 1, 1)), eng.state.last_log_id());
    assert_eq!(
        MembershipState::new(
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
        ),
        eng.state.membership_state
    );
    assert_eq!(ServerState::Learner, eng.state.server_state);
    assert_eq!(
        vec![
            Command::SaveVote {
                vote: Vote::new_committed(2, 1)
            },
            Command::DeleteConflictLog { since: log_id(1, 1, 2) },
        ],
        eng.output.take_commands()
    );

    Ok(())
}

#[test]
fn test_append_entries_prev_log_id_is_committed() -> anyhow::Result<()> {
    let mut eng = eng();

    let res = eng.append_entries(&Vote::new_committed(2, 1), Some(log_id(0, 1, 0)), vec![
        blank_ent(1, 1, 1),
        blank_ent(2, 1, 2),
    ]);

    assert_eq!(Ok(()), res);
    assert_eq!(
        &[
            log_id(1, 1, 1), //
            log_id(2, 1, 2), //
        ],
        eng.state.log_ids.key_log_ids()
    );
    assert_eq!(Vote::new_committed(2, 1), *eng.state.vote_ref());
    assert_eq!(Some(&log_id(2, 1, 2)), eng.state.last_log_id());
    assert_eq!(
        MembershipState::new(
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
        ),
        eng.state.membership_state
    );
    assert_eq!(ServerState::Learner, eng.state.server_state);
    assert_eq!(
        vec![
            Command::SaveVote {
                vote: Vote::new_committed(2, 1)
            },
            Command::DeleteConflictLog { since: log_id(1, 1, 2) },
            Command::AppendInputEntries {
                vote: Vote::new_committed(2, 1),
                entries: vec![blank_ent(2, 1, 2)]
            },
        ],
        eng.output.take_commands()
    );

    Ok(())
}

#[test]
fn test_append_entries_prev_log_id_not_exists() -> anyhow::Result<()> {
    let mut eng = eng();
    eng.state.vote = UTime::new(TokioInstant::now(), Vote::new(1, 2));
    eng.output.take_commands();

    let res = eng.append_entries(&Vote::new_committed(2, 1), Some(log_id(2, 1, 4)), vec![
        blank_ent(2, 1, 5),
        blank_ent(2, 1, 6),
    ]);

    assert_eq!(
        Err(RejectAppendEntries::ByConflictingLogId {
            expect: log_id(2, 1, 4),
            local: None,
        }),
        res
    );
    assert_eq!(
        &[
            log_id(1, 1, 1), //
            log_id(2, 1, 3), //
        ],
        eng.state.log_ids.key_log_ids()
    );
    assert_eq!(Vote::new_committed(2, 1), *eng.state.vote_ref());
    assert_eq!(Some(&log_id(2, 1, 3)), eng.state.last_log_id());
    assert_eq!(
        MembershipState::new(
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
            Arc::new(EffectiveMembership::new(Some(log_id(2, 1, 3)), m23())),
        ),
        eng.state.membership_state
    );
    assert_eq!(ServerState::Follower, eng.state.server_state);
    assert_eq!(
        vec![Command::SaveVote {
            vote: Vote::new_committed(2, 1)
        },],
        eng.output.take_commands()
    );

    Ok(())
}

#[test]
fn test_append_entries_conflict() -> anyhow::Result<()> {
    // prev_log_id matches,
    // The second entry in entries conflict.
    // This request will replace the effective membership.
    // committed is greater than entries.
    // It is no longer a member, change to learner
    let mut eng = eng();

    let resp = eng.append_entries(&Vote::new_committed(2, 1), Some(log_id(1, 1, 1)), vec![
        blank_ent(1, 1, 2),
        Entry::new_membership(log_id(3, 1, 3), m34()),
    ]);

    assert_eq!(Ok(()), resp);
    assert_eq!(
        &[
            log_id(1, 1, 1), //
            log_id(3, 1, 3), //
        ],
        eng.state.log_ids.key_log_ids()
    );
    assert_eq!(Vote::new_committed(2, 1), *eng.state.vote_ref());
    assert_eq!(Some(&log_id(3, 1, 3)), eng.state.last_log_id());
    assert_eq!(
        MembershipState::new(
            Arc::new(EffectiveMembership::new(Some(log_id(1, 1, 1)), m01())),
            Arc::new(EffectiveMembership::new(Some(log_id(3, 1, 3)), m34())),
        ),
        eng.state.membership_state
    );
    assert_eq!(ServerState::Learner, eng.state.server_state);
    assert_eq!(
        vec![
            Command::SaveVote {
                vote: Vote::new_committed(2, 1)
            },
            Command::DeleteConflictLog { since: log_id(2, 1, 3) },
            Command::AppendInputEntries {
                vote: Vote::new_committed(2, 1),
                entries: vec![Entry::new_membership(log_id(3, 1, 3), m34())]
            },
        ],
        eng.output.take_commands()
    );

    Ok(())
}

/// Idem: a follower commits what the leader committed among the entries it already accepted from
/// it before it appends the new ones, so the state machine applies them while the new entries are
/// written; the rest of the leader's commit follows the append, as before.
#[test]
fn test_commit_before_append_commits_the_accepted_entries_first() -> anyhow::Result<()> {
    let mut eng = eng();
    eng.state.vote = UTime::new(TokioInstant::now(), Vote::new_committed(2, 1));
    eng.state.update_accepted(Some(log_id(2, 1, 3)));

    // The leader has committed past what this node holds: only what it holds commits first.
    eng.handle_append_entries_request(
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(2, 1, 3)),
            leader_commit: Some(log_id(2, 1, 5)),
            entries: vec![blank_ent(2, 1, 4), blank_ent(2, 1, 5)],
        },
        None,
    );

    assert_eq!(Some(&log_id(2, 1, 5)), eng.state.committed());
    assert_eq!(
        vec![
            Command::Commit {
                seq: 1,
                already_committed: Some(log_id(0, 1, 0)),
                upto: log_id(2, 1, 3),
            },
            Command::AppendInputEntries {
                vote: Vote::new_committed(2, 1),
                entries: vec![blank_ent(2, 1, 4), blank_ent(2, 1, 5)],
            },
            Command::Commit {
                seq: 2,
                already_committed: Some(log_id(2, 1, 3)),
                upto: log_id(2, 1, 5),
            },
        ],
        eng.output.take_commands()
    );

    Ok(())
}

/// Idem: a request refused for its `prev_log_id` still lets the entries accepted earlier from the
/// same leader commit (they are that leader's, and it has committed them), and commits nothing
/// more.
#[test]
fn test_commit_before_append_of_a_refused_request_commits_only_the_accepted_entries() -> anyhow::Result<()> {
    let mut eng = eng();
    eng.state.vote = UTime::new(TokioInstant::now(), Vote::new_committed(2, 1));
    eng.state.update_accepted(Some(log_id(2, 1, 3)));

    eng.handle_append_entries_request(
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(2, 1, 9)),
            leader_commit: Some(log_id(2, 1, 9)),
            entries: vec![blank_ent(2, 1, 10)],
        },
        None,
    );

    assert_eq!(Some(&log_id(2, 1, 3)), eng.state.committed());
    assert_eq!(Some(&log_id(2, 1, 3)), eng.state.last_log_id());
    assert_eq!(
        vec![Command::Commit {
            seq: 1,
            already_committed: Some(log_id(0, 1, 0)),
            upto: log_id(2, 1, 3),
        }],
        eng.output.take_commands()
    );

    Ok(())
}

/// Idem: what a node accepted under its own vote says nothing of another leader's log: an
/// AppendEntries under another vote commits nothing before it is handled.
#[test]
fn test_commit_before_append_under_another_vote_commits_nothing() -> anyhow::Result<()> {
    for vote in [Vote::new_committed(3, 1), Vote::new(2, 1), Vote::new_committed(2, 2)] {
        let mut eng = eng();
        eng.state.vote = UTime::new(TokioInstant::now(), Vote::new_committed(2, 1));
        eng.state.update_accepted(Some(log_id(2, 1, 3)));

        eng.commit_before_append(&vote, Some(log_id(2, 1, 3)));

        assert_eq!(Some(&log_id(0, 1, 0)), eng.state.committed(), "{vote}");
        assert_eq!(0, eng.output.take_commands().len(), "{vote}");
    }

    // This node's own vote, not committed (it is a candidate or voted for one): no leader yet.
    let mut eng = eng();
    eng.state.vote = UTime::new(TokioInstant::now(), Vote::new(2, 1));
    eng.commit_before_append(&Vote::new(2, 1), Some(log_id(2, 1, 3)));
    assert_eq!(Some(&log_id(0, 1, 0)), eng.state.committed());
    assert_eq!(0, eng.output.take_commands().len());

    Ok(())
}
