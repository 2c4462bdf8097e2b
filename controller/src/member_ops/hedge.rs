//! Asking one of several equivalent endpoints with hedging: the first is asked; while it has
//! not answered after a short delay (or once it failed), the next is asked too, and the first
//! answer wins. A frozen member (SIGSTOP, a hung disk) accepts connections and never answers,
//! so asking the members one after another waits a whole call timeout on it before the next is
//! tried, and the operator's view of the cluster comes late exactly when a member is in trouble.
//!
//! Hand-written: tower's `hedge` layer hedges one service on latency percentiles it learns, not
//! an ordered list of different endpoints, and pulls in its own buffering.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

/// How long the endpoint asked last may stay silent before the next one is asked too.
pub const HEDGE_AFTER: Duration = Duration::from_millis(250);

/// Asks endpoints `0..count` through `ask`, in order, each next one once the last one asked
/// failed or has been silent for `hedge`, and returns the first answer with its endpoint's index.
/// Answers still due from other endpoints are dropped. When every endpoint failed, returns each
/// one's error with its index, in the order they failed.
pub async fn first_answer<T, E, F, Fut>(
    count: usize,
    hedge: Duration,
    mut ask: F,
) -> Result<(usize, T), Vec<(usize, E)>>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut pending = FuturesUnordered::new();
    let mut errors = Vec::new();
    let mut next = 0;
    loop {
        if pending.is_empty() {
            if next >= count {
                return Err(errors);
            }
            pending.push(tagged(next, ask(next)));
            next += 1;
        }
        let more = next < count;
        tokio::select! {
            Some((index, answer)) = pending.next() => match answer {
                Ok(value) => return Ok((index, value)),
                Err(error) => {
                    errors.push((index, error));
                    if more {
                        pending.push(tagged(next, ask(next)));
                        next += 1;
                    }
                }
            },
            () = tokio::time::sleep(hedge), if more => {
                pending.push(tagged(next, ask(next)));
                next += 1;
            }
        }
    }
}

async fn tagged<Fut: Future>(index: usize, fut: Fut) -> (usize, Fut::Output) {
    (index, fut.await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    /// What an endpoint does when asked: answer after a delay, fail after a delay, or never.
    #[derive(Clone, Copy)]
    enum Endpoint {
        Answers(u64),
        Fails(u64),
        Silent,
    }

    /// Runs `first_answer` over `endpoints` (paused time), returning its result, when it came
    /// (ms of virtual time) and which endpoints were asked, in order.
    async fn run(
        endpoints: &[Endpoint],
    ) -> (Result<(usize, String), Vec<(usize, String)>>, u128, Vec<usize>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let result = first_answer(endpoints.len(), HEDGE_AFTER, |i| {
            asked.lock().unwrap().push(i);
            let endpoint = endpoints[i];
            async move {
                match endpoint {
                    Endpoint::Answers(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Ok(format!("answer of {i}"))
                    }
                    Endpoint::Fails(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Err(format!("error of {i}"))
                    }
                    Endpoint::Silent => {
                        std::future::pending::<()>().await;
                        Err("never".to_owned())
                    }
                }
            }
        })
        .await;
        let took = start.elapsed().as_millis();
        let asked = asked.lock().unwrap().clone();
        (result, took, asked)
    }

    #[tokio::test(start_paused = true)]
    async fn an_answering_first_endpoint_is_the_only_one_asked() {
        let (result, took, asked) =
            run(&[Endpoint::Answers(100), Endpoint::Answers(1), Endpoint::Silent]).await;
        assert_eq!(result, Ok((0, "answer of 0".to_owned())));
        assert_eq!(took, 100);
        assert_eq!(asked, [0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_first_endpoint_costs_the_hedge_delay_not_a_call_timeout() {
        let (result, took, asked) =
            run(&[Endpoint::Silent, Endpoint::Answers(10), Endpoint::Answers(1)]).await;
        assert_eq!(result, Ok((1, "answer of 1".to_owned())));
        assert_eq!(took, 260);
        assert_eq!(asked, [0, 1]);
        // Two silent ones: the third is asked after two delays.
        let (result, took, asked) = run(&[Endpoint::Silent, Endpoint::Silent, Endpoint::Answers(10)]).await;
        assert_eq!(result, Ok((2, "answer of 2".to_owned())));
        assert_eq!(took, 510);
        assert_eq!(asked, [0, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_first_answer_still_wins_over_a_later_one() {
        // Endpoint 0 answers at 300 ms; endpoint 1, asked at 250 ms, would answer at 450 ms.
        let (result, took, asked) = run(&[Endpoint::Answers(300), Endpoint::Answers(200)]).await;
        assert_eq!(result, Ok((0, "answer of 0".to_owned())));
        assert_eq!(took, 300);
        assert_eq!(asked, [0, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_asks_the_next_at_once() {
        let (result, took, asked) = run(&[Endpoint::Fails(20), Endpoint::Answers(10)]).await;
        assert_eq!(result, Ok((1, "answer of 1".to_owned())));
        assert_eq!(took, 30);
        assert_eq!(asked, [0, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_endpoint_fails_each_error_is_returned_in_the_order_they_came() {
        // 0 fails at 400 ms; 1 (asked at 250) fails at 260; 2 is asked at 260 and fails at 265.
        let (result, took, asked) =
            run(&[Endpoint::Fails(400), Endpoint::Fails(10), Endpoint::Fails(5)]).await;
        assert_eq!(
            result,
            Err(vec![
                (1, "error of 1".to_owned()),
                (2, "error of 2".to_owned()),
                (0, "error of 0".to_owned()),
            ])
        );
        assert_eq!(took, 400);
        assert_eq!(asked, [0, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_endpoint_is_an_empty_failure() {
        let (result, took, asked) = run(&[]).await;
        assert_eq!(result, Err(Vec::new()));
        assert_eq!(took, 0);
        assert!(asked.is_empty());
    }
}
