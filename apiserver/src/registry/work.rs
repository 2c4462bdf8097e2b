//! A count of elementary steps (a path compared, a list item matched), kept only in test builds.
//! The tests that prove a pass over an object is linear in the object's size compare this count
//! at `n` and at `4n` elements, which a test can do without a clock: a quadratic pass does 16
//! times the work at `4n`, a linear one 4 times. Release builds compile [`step`] to nothing.

#[cfg(test)]
thread_local! {
    static STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one step (test builds only).
#[inline(always)]
pub(crate) fn step() {
    #[cfg(test)]
    STEPS.with(|s| s.set(s.get() + 1));
}

/// Runs `f` and returns its result with the steps it counted on this thread.
#[cfg(test)]
pub(crate) fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = STEPS.with(std::cell::Cell::get);
    let out = f();
    (out, STEPS.with(std::cell::Cell::get) - before)
}

/// Asserts that `work(n)` grows linearly: the steps at `4n` are at most `4 × 1.5` times those at
/// `n` (a quadratic pass gives 16), and the steps at `n` are at least `n / 2` (the count covers
/// the pass at all). `n` should be large enough that constant overheads do not matter.
#[cfg(test)]
#[track_caller]
pub(crate) fn assert_linear(n: usize, mut work: impl FnMut(usize)) {
    let (_, small) = counted(|| work(n));
    let (_, large) = counted(|| work(4 * n));
    assert!(
        small >= (n / 2) as u64,
        "{small} steps for n = {n}: the pass does not count its steps"
    );
    assert!(
        large * 2 <= small * 12,
        "{small} steps for n = {n}, {large} for 4n: not linear"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quadratic_pass_fails_the_check_and_a_linear_one_passes() {
        let linear = |n: usize| (0..n).for_each(|_| step());
        assert_linear(1000, linear);
        let quadratic = |n: usize| (0..n * n).for_each(|_| step());
        let caught = std::panic::catch_unwind(|| assert_linear(1000, quadratic));
        assert!(caught.is_err());
        let silent = std::panic::catch_unwind(|| assert_linear(1000, |_| {}));
        assert!(silent.is_err(), "a pass that counts nothing must fail the check");
    }
}
