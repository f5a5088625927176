//! Idem: added. A timer kept across waits for one deadline after another.

use std::pin::Pin;

use crate::type_config::alias::InstantOf;
use crate::type_config::alias::SleepOf;
use crate::type_config::TypeConfigExt;
use crate::RaftTypeConfig;

/// A timer kept across waits while it fires no later than the deadline waited for.
///
/// Each new tokio timer that is due before the runtime's next wake-up wakes the runtime's driver
/// (an eventfd write, and one more poll of the sockets), even from the runtime's own thread. A
/// replication stream waits for a commit-news deadline after every commit, so under load a new
/// timer per wait cost its runtime that much per log entry. A kept timer armed for an earlier
/// deadline, since cleared, fires before a later one: [`KeptTimer::fired`] then says to wait on.
pub(crate) struct KeptTimer<C: RaftTypeConfig> {
    timer: Option<(InstantOf<C>, Pin<Box<SleepOf<C>>>)>,
}

impl<C: RaftTypeConfig> KeptTimer<C> {
    pub(crate) fn new() -> Self {
        Self { timer: None }
    }

    /// The timer to wait on for `deadline`: the one kept if it fires no later, otherwise a new
    /// one.
    pub(crate) fn until(&mut self, deadline: &InstantOf<C>) -> &mut Pin<Box<SleepOf<C>>> {
        if !matches!(&self.timer, Some((at, _)) if at <= deadline) {
            self.timer = Some((*deadline, Box::pin(C::sleep_until(*deadline))));
        }
        &mut self.timer.as_mut().unwrap().1
    }

    /// Notes that the timer waited on fired: whether `deadline` is reached (otherwise it fired
    /// for an earlier one, and the wait goes on with [`KeptTimer::until`]).
    pub(crate) fn fired(&mut self, deadline: &InstantOf<C>) -> bool {
        self.timer = None;
        C::now() >= *deadline
    }

    /// The instant the kept timer fires at, if one is kept.
    #[cfg(test)]
    pub(crate) fn armed_at(&self) -> Option<InstantOf<C>> {
        self.timer.as_ref().map(|(at, _)| *at)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::KeptTimer;
    use crate::engine::testing::UTConfig;
    use crate::type_config::TypeConfigExt;

    /// A wait for a later deadline keeps the timer armed for an earlier one; when that fires
    /// the later deadline is not reached, and a timer for it is armed then.
    #[tokio::test(flavor = "current_thread")]
    async fn a_later_deadline_keeps_the_earlier_timer_and_waits_on() {
        let mut t = KeptTimer::<UTConfig>::new();
        let now = UTConfig::now();
        let (early, late) = (
            now + Duration::from_millis(10),
            now + Duration::from_millis(300),
        );
        t.until(&early);
        assert_eq!(Some(early), t.armed_at());
        t.until(&late).as_mut().await;
        assert_eq!(
            Some(early),
            t.armed_at(),
            "a new timer was armed for the later deadline"
        );
        assert!(UTConfig::now() >= early);
        assert!(
            !t.fired(&late),
            "the later deadline counted as reached at the earlier one"
        );
        assert_eq!(None, t.armed_at());
        t.until(&late).as_mut().await;
        assert_eq!(Some(late), t.armed_at());
        assert!(t.fired(&late));
        // An earlier deadline than the kept timer's gets a timer of its own.
        let (soon, later) = (
            UTConfig::now() + Duration::from_millis(5),
            UTConfig::now() + Duration::from_millis(50),
        );
        t.until(&later);
        t.until(&soon).as_mut().await;
        assert_eq!(Some(soon), t.armed_at());
        assert!(t.fired(&soon));
    }
}
