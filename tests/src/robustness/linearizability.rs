//! A linearizability checker for recorded histories: Wing & Gong's search with Lowe's memoisation
//! over (linearized set, model state), the algorithm porcupine implements, plus a register model.
//!
//! No crate on crates.io fits: `lincheck` runs in-process data structures under loom and cannot
//! take a recorded history; `stateright`'s tester belongs to its own actor models and has no notion
//! of an operation with an unknown outcome. So it is written here, small and tested.
//!
//! An operation whose outcome the client never learned (a timeout, a broken connection) gets no
//! return time: it may have taken effect at any point after its call, or never (it is then
//! linearized after everything else, where it changes nothing anyone observed), as porcupine does
//! with a return time of infinity.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

/// A sequential specification: the state an operation moves the model to, if the operation with
/// that output is legal in that state.
pub trait Model {
    /// The model's state (hashed for the memoisation).
    type State: Clone + Eq + Hash + Debug;
    /// What a client asked.
    type Input: Debug;
    /// What the client was answered.
    type Output: Debug;
    /// The state before any operation.
    fn init(&self) -> Self::State;
    /// The state after `input` answered with `output` in `state`; `None` when that answer is
    /// impossible there.
    fn step(&self, state: &Self::State, input: &Self::Input, output: &Self::Output) -> Option<Self::State>;
}

/// One recorded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// The client that issued it (a client has one operation in flight at a time).
    pub client: usize,
    /// What was asked.
    pub input: I,
    /// What was answered (for an unknown outcome, whatever the model takes as "unknown").
    pub output: O,
    /// When it was called (any monotonic unit, e.g. nanoseconds since the run began).
    pub call: u64,
    /// When its answer came; `None` when none came (it may take effect at any later time).
    pub ret: Option<u64>,
}

/// The checker's answer for one history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations, each between its call and its return, explains every answer.
    Linearizable,
    /// No such order exists.
    NotLinearizable {
        /// The longest partial linearization found (operation indices, in order).
        longest: Vec<usize>,
        /// An operation that could not be placed after it: it returned before any legal order
        /// could include it.
        stuck: usize,
    },
    /// The search was stopped after `steps` steps without an answer.
    Undecided {
        /// Steps taken.
        steps: usize,
    },
}

impl Verdict {
    /// Whether the history was shown not linearizable.
    pub fn is_violation(&self) -> bool {
        matches!(self, Verdict::NotLinearizable { .. })
    }
}

const NIL: usize = usize::MAX;
const HEAD: usize = 0;

/// A call or return event in the doubly linked event list the search lifts entries out of.
#[derive(Debug, Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    /// The call's return event, or the return's call event.
    partner: usize,
}

/// The event list: node 0 is the head; the others are events in time order.
#[derive(Debug)]
struct Events {
    events: Vec<Event>,
    next: Vec<usize>,
    prev: Vec<usize>,
}

impl Events {
    fn new<I, O>(ops: &[Operation<I, O>]) -> Self {
        // (time, returns after calls at the same time, op): two operations touching at one instant
        // count as concurrent, which can only make the checker more lenient, never wrong.
        let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            order.push((op.call, false, i));
            order.push((op.ret.unwrap_or(u64::MAX), true, i));
        }
        order.sort_unstable();
        let n = order.len();
        let mut events = vec![
            Event {
                op: NIL,
                is_call: false,
                partner: NIL,
            };
            n + 1
        ];
        let mut call_node = vec![NIL; ops.len()];
        let mut return_node = vec![NIL; ops.len()];
        for (pos, (_, is_return, op)) in order.iter().enumerate() {
            let node = pos + 1;
            events[node] = Event {
                op: *op,
                is_call: !is_return,
                partner: NIL,
            };
            if *is_return {
                return_node[*op] = node;
            } else {
                call_node[*op] = node;
            }
        }
        for op in 0..ops.len() {
            events[call_node[op]].partner = return_node[op];
            events[return_node[op]].partner = call_node[op];
        }
        let next = (0..=n).map(|i| if i == n { NIL } else { i + 1 }).collect();
        let prev = (0..=n).map(|i| if i == 0 { NIL } else { i - 1 }).collect();
        Self { events, next, prev }
    }

    fn unlink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = node;
        if n != NIL {
            self.prev[n] = node;
        }
    }

    /// Takes a call and its return out of the list.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(self.events[call].partner);
    }

    /// Puts back what [`Self::lift`] took out (in reverse order of the lifts).
    fn unlift(&mut self, call: usize) {
        self.relink(self.events[call].partner);
        self.relink(call);
    }
}

/// A set of operation indices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Self(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

/// Checks one history (of one key, for a register) against `model`, giving up after
/// `max_steps` search steps.
pub fn check<M: Model>(model: &M, ops: &[Operation<M::Input, M::Output>], max_steps: usize) -> Verdict {
    let mut list = Events::new(ops);
    let mut state = model.init();
    let mut linearized = Bits::new(ops.len());
    let mut seen: HashSet<(Bits, M::State)> = HashSet::new();
    // (call node lifted, state before it)
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut longest: (Vec<usize>, usize) = (Vec::new(), NIL);
    let mut entry = list.next[HEAD];
    let mut steps = 0usize;
    while list.next[HEAD] != NIL {
        steps += 1;
        if steps > max_steps {
            return Verdict::Undecided { steps: max_steps };
        }
        let event = if entry == NIL {
            None
        } else {
            Some(list.events[entry])
        };
        match event {
            Some(event) if event.is_call => {
                let op = &ops[event.op];
                if let Some(next) = model.step(&state, &op.input, &op.output) {
                    let mut with = linearized.clone();
                    with.set(event.op);
                    if seen.insert((with.clone(), next.clone())) {
                        stack.push((entry, std::mem::replace(&mut state, next)));
                        linearized = with;
                        list.lift(entry);
                        entry = list.next[HEAD];
                        continue;
                    }
                }
                entry = list.next[entry];
            }
            // A return whose operation is not linearized yet (or the list's end): undo the last choice.
            _ => {
                if longest.1 == NIL || stack.len() > longest.0.len() {
                    let stuck = event.map_or(NIL, |e| e.op);
                    longest = (
                        stack.iter().map(|(node, _)| list.events[*node].op).collect(),
                        stuck,
                    );
                }
                let Some((node, before)) = stack.pop() else {
                    return Verdict::NotLinearizable {
                        longest: longest.0,
                        stuck: longest.1,
                    };
                };
                state = before;
                linearized.clear(list.events[node].op);
                list.unlift(node);
                entry = list.next[node];
            }
        }
    }
    Verdict::Linearizable
}

/// A value written to a register, interned (the history module maps strings to these).
pub type Value = u32;

/// What a client asks of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterInput {
    /// Put a value.
    Put(Value),
    /// Read the value (linearizable read).
    Get,
    /// Put `new` if the value is `expect` (`None`: the key does not exist).
    CompareAndSwap {
        /// The value compared against.
        expect: Option<Value>,
        /// The value put when the comparison holds.
        new: Value,
    },
}

/// What the client was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterOutput {
    /// The put was acknowledged.
    Written,
    /// The value read (`None`: no such key).
    Read(Option<Value>),
    /// Whether the compare-and-swap's comparison held (and so its put happened).
    Swapped(bool),
    /// No answer: it may or may not have taken effect.
    Unknown,
}

/// A key-value register starting absent: the model of one etcd key under put, get and a
/// compare-and-swap transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct Register;

impl Model for Register {
    type State = Option<Value>;
    type Input = RegisterInput;
    type Output = RegisterOutput;

    fn init(&self) -> Self::State {
        None
    }

    fn step(&self, state: &Self::State, input: &Self::Input, output: &Self::Output) -> Option<Self::State> {
        use RegisterInput as I;
        use RegisterOutput as O;
        match (input, output) {
            (I::Put(v), O::Written | O::Unknown) => Some(Some(*v)),
            (I::Get, O::Read(read)) => (read == state).then_some(*state),
            (I::Get, O::Unknown) => Some(*state),
            (I::CompareAndSwap { expect, new }, O::Swapped(true)) => (expect == state).then_some(Some(*new)),
            (I::CompareAndSwap { expect, .. }, O::Swapped(false)) => (expect != state).then_some(*state),
            // Taken effect at this point: it swapped if the comparison held here. Never taken effect
            // is the same as being linearized last, which the search can always do.
            (I::CompareAndSwap { expect, new }, O::Unknown) => {
                Some(if expect == state { Some(*new) } else { *state })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use RegisterInput::*;
    use RegisterOutput::*;

    type Op = Operation<RegisterInput, RegisterOutput>;

    fn op(client: usize, input: RegisterInput, output: RegisterOutput, call: u64, ret: u64) -> Op {
        Operation {
            client,
            input,
            output,
            call,
            ret: Some(ret),
        }
    }

    fn unknown(client: usize, input: RegisterInput, call: u64) -> Op {
        Operation {
            client,
            input,
            output: Unknown,
            call,
            ret: None,
        }
    }

    fn verdict(ops: &[Op]) -> Verdict {
        check(&Register, ops, 1_000_000)
    }

    #[test]
    fn an_empty_history_and_a_sequential_one_pass() {
        assert_eq!(verdict(&[]), Verdict::Linearizable);
        let ops = [
            op(0, Get, Read(None), 0, 1),
            op(0, Put(1), Written, 2, 3),
            op(1, Get, Read(Some(1)), 4, 5),
            op(1, Put(2), Written, 6, 7),
            op(0, Get, Read(Some(2)), 8, 9),
        ];
        assert_eq!(verdict(&ops), Verdict::Linearizable);
    }

    #[test]
    fn reads_concurrent_with_a_put_may_see_either_value() {
        // porcupine's register example: put 1 over [0, 100]; one read sees it, one does not.
        let ops = [
            op(0, Put(1), Written, 0, 100),
            op(1, Get, Read(Some(1)), 25, 75),
            op(2, Get, Read(None), 30, 60),
        ];
        assert_eq!(verdict(&ops), Verdict::Linearizable);
    }

    #[test]
    fn a_read_that_goes_back_in_time_fails() {
        // Same, but the read of nothing starts after a read already saw the put.
        let ops = [
            op(0, Put(1), Written, 0, 100),
            op(1, Get, Read(Some(1)), 25, 75),
            op(2, Get, Read(None), 80, 90),
        ];
        let v = verdict(&ops);
        assert!(v.is_violation(), "{v:?}");
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_write_fails() {
        let ops = [
            op(0, Put(1), Written, 0, 10),
            op(0, Put(2), Written, 20, 30),
            op(1, Get, Read(Some(1)), 40, 50),
        ];
        match verdict(&ops) {
            Verdict::NotLinearizable { longest, stuck } => {
                assert_eq!(stuck, 2, "the stale read is the one that cannot be placed");
                assert_eq!(longest, vec![0, 1]);
            }
            other => panic!("a stale read passed: {other:?}"),
        }
    }

    #[test]
    fn a_lost_write_fails() {
        // Acknowledged, then read back as absent.
        let ops = [op(0, Put(1), Written, 0, 10), op(1, Get, Read(None), 20, 30)];
        assert!(verdict(&ops).is_violation());
    }

    #[test]
    fn a_read_of_a_value_never_written_fails() {
        let ops = [
            op(0, Put(1), Written, 0, 10),
            op(1, Put(2), Written, 5, 15),
            op(2, Get, Read(Some(7)), 20, 30),
        ];
        assert!(verdict(&ops).is_violation());
    }

    #[test]
    fn a_put_with_unknown_outcome_may_have_happened_later_or_never() {
        // Seen long after its call, after a read that did not see it yet.
        let ops = [
            op(0, Put(1), Written, 0, 10),
            unknown(1, Put(2), 20),
            op(2, Get, Read(Some(1)), 40, 50),
            op(2, Get, Read(Some(2)), 60, 70),
        ];
        assert_eq!(verdict(&ops), Verdict::Linearizable);
        // Never seen at all.
        let ops = [
            op(0, Put(1), Written, 0, 10),
            unknown(1, Put(2), 20),
            op(2, Get, Read(Some(1)), 40, 50),
        ];
        assert_eq!(verdict(&ops), Verdict::Linearizable);
        // But it cannot take effect before its call...
        let ops = [op(2, Get, Read(Some(2)), 0, 10), unknown(1, Put(2), 20)];
        assert!(verdict(&ops).is_violation());
        // ...nor be undone once seen.
        let ops = [
            op(0, Put(1), Written, 0, 10),
            unknown(1, Put(2), 20),
            op(2, Get, Read(Some(2)), 40, 50),
            op(2, Get, Read(Some(1)), 60, 70),
        ];
        assert!(verdict(&ops).is_violation());
    }

    #[test]
    fn compare_and_swap_follows_the_value_it_compared() {
        let ops = [
            op(0, Put(1), Written, 0, 10),
            op(
                1,
                CompareAndSwap {
                    expect: Some(1),
                    new: 2,
                },
                Swapped(true),
                20,
                30,
            ),
            op(
                0,
                CompareAndSwap {
                    expect: Some(1),
                    new: 3,
                },
                Swapped(false),
                40,
                50,
            ),
            op(1, Get, Read(Some(2)), 60, 70),
        ];
        assert_eq!(verdict(&ops), Verdict::Linearizable);
        // A swap that claims success on a value that was not there.
        let ops = [
            op(0, Put(1), Written, 0, 10),
            op(
                1,
                CompareAndSwap {
                    expect: Some(5),
                    new: 2,
                },
                Swapped(true),
                20,
                30,
            ),
        ];
        assert!(verdict(&ops).is_violation());
        // Two swaps from the same value cannot both succeed.
        let ops = [
            op(0, Put(1), Written, 0, 10),
            op(
                1,
                CompareAndSwap {
                    expect: Some(1),
                    new: 2,
                },
                Swapped(true),
                20,
                30,
            ),
            op(
                2,
                CompareAndSwap {
                    expect: Some(1),
                    new: 3,
                },
                Swapped(true),
                20,
                30,
            ),
        ];
        assert!(verdict(&ops).is_violation());
        // One with an unknown outcome may have swapped.
        let ops = [
            op(0, Put(1), Written, 0, 10),
            unknown(
                1,
                CompareAndSwap {
                    expect: Some(1),
                    new: 2,
                },
                20,
            ),
            op(2, Get, Read(Some(2)), 40, 50),
        ];
        assert_eq!(verdict(&ops), Verdict::Linearizable);
    }

    /// A history made from a sequential run: each operation's interval contains its point in the
    /// run, so it is linearizable by construction, whatever the overlaps.
    fn generated(seed: u64, n: usize) -> Vec<Op> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut value = None;
        let mut ops = Vec::new();
        for i in 0..n {
            let point = 100 * i as u64 + 1000;
            let call = point - rng.random_range(0..400);
            let ret = point + rng.random_range(0..400);
            let client = i % 4;
            if rng.random_bool(0.5) {
                let v = i as Value;
                value = Some(v);
                if rng.random_bool(0.2) {
                    ops.push(unknown(client, Put(v), call));
                } else {
                    ops.push(op(client, Put(v), Written, call, ret));
                }
            } else {
                ops.push(op(client, Get, Read(value), call, ret));
            }
        }
        ops
    }

    #[test]
    fn generated_linearizable_histories_pass_and_a_budget_stops_the_search() {
        for seed in 0..20 {
            let ops = generated(seed, 300);
            assert_eq!(verdict(&ops), Verdict::Linearizable, "seed {seed}");
        }
        let ops = generated(1, 300);
        assert_eq!(check(&Register, &ops, 10), Verdict::Undecided { steps: 10 });
    }

    #[test]
    fn a_generated_history_with_one_read_made_stale_fails() {
        // Every read of a value is followed (strictly after its return) by a put and then a read
        // of another value; turning that later read back into the first value is a violation.
        let mut ops = vec![op(0, Put(0), Written, 0, 10), op(1, Get, Read(Some(0)), 20, 30)];
        let mut t = 40;
        for v in 1..200 {
            ops.push(op(v as usize % 3, Put(v), Written, t, t + 15));
            ops.push(op((v as usize + 1) % 3, Get, Read(Some(v)), t + 5, t + 30));
            t += 40;
        }
        assert_eq!(verdict(&ops), Verdict::Linearizable);
        let last = ops.len() - 1;
        ops[last].output = Read(Some(150));
        assert!(verdict(&ops).is_violation());
    }
}
