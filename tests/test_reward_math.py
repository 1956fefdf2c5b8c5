"""The maths reward (tepo_verl.reward): verdicts on real answer forms, robustness, thread safety, verl wiring."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tepo_verl.reward import compute_score, grade_response, normalize_ground_truths
from tepo_verl.reward.pool import GraderPool

# (response, reference answer, expected verdict). Each row is a form that models really write.
ANSWER_TABLE = [
    # plain boxed answers
    ("The answer is \\boxed{42}.", "42", True),
    ("\\boxed{41}", "42", False),
    ("\\boxed{-3}", "-3", True),
    ("\\boxed{3}", "-3", False),
    ("$\\boxed{5}$ apples", "5", True),
    ("\\boxed{9}", "9.0", True),
    # nested braces inside the box
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{x^{2}+2x+1}", "(x+1)^2", True),
    # fractions vs decimals
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", True),
    ("\\boxed{0.75}", "\\frac34", True),
    ("\\boxed{\\frac{3}{4}}", "\\frac{4}{3}", False),
    ("\\boxed{0.33}", "\\frac13", False),  # a rounded decimal is not the fraction
    ("\\boxed{\\pi}", "3.14", False),
    # other LaTeX objects
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("\\boxed{(1, 2]}", "(1,2]", True),
    ("\\boxed{[1,2]}", "(1,2)", False),
    ("\\boxed{x \\in [2, 5)}", "[2,5)", True),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
    ("\\boxed{4 + 2i}", "4+2i", True),
    ("\\boxed{\\infty}", "\\infty", True),
    ("\\boxed{x=5}", "5", True),
    ("\\boxed{\\text{(B)}}", "B", True),
    ("\\boxed{B}", "\\text{(B)}", True),
    ("\\boxed{\\text{Monday}}", "\\text{Monday}", True),
    ("\\boxed{\\text{Monday}}", "\\text{Tuesday}", False),
    # units, degrees, currency, thousands separators, percent
    ("\\boxed{18 \\text{ cm}}", "18", True),
    ("\\boxed{18}", "18\\text{ cm}", True),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{90}", "90^\\circ", True),
    ("\\boxed{\\$18}", "18", True),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{1000}", "1,000", True),
    ("\\boxed{10}", "10\\%", True),
    ("\\boxed{10\\%}", "10", False),  # math-verify reads 10\% as 0.1
    # multiple answers
    ("\\boxed{2, 3}", "3, 2", True),
    ("\\boxed{2} and \\boxed{3}", "2, 3", False),  # the last box alone is the answer
    ("\\boxed{2}", "2, 3", False),
    ("\\boxed{3, 5}", "3", False),
    # no answer
    ("I don't know.", "5", False),
    ("", "5", False),
    ("\\boxed{}", "5", False),
    ("\\boxed{5", "5", False),  # unclosed box
    # answer outside the box
    ("The final answer is $42$.", "42", True),
    ("Answer: 42", "42", True),  # the DAPO template's form
    ("we have 12 eggs and sell 3, so 9 remain", "9", True),
]

# The maths-RL convention: the final answer is the last \boxed{...}. Cases written for this project, each with the
# verdict that the convention gives and the one that a different reading would give.
LAST_BOX_TABLE = [
    # a boxed draft that the response goes on to correct: only the correction counts
    ("40+3 is \\boxed{42}. Wait, that is wrong: 40+3=43, so \\boxed{43}.", "43", True),
    ("40+3 is \\boxed{42}. Wait, that is wrong: 40+3=43, so \\boxed{43}.", "42", False),
    ("First \\boxed{41}, corrected: \\boxed{42}", "42", True),
    ("First \\boxed{41}, corrected: \\boxed{42}", "41", False),
    ("\\boxed{\\frac{1}{3}} no, recomputing gives \\boxed{\\frac{2}{3}}", "\\frac23", True),
    # text after the last box is not an answer, even an answer-like phrase or a final expression
    ("\\boxed{8}. The final answer is 9", "8", True),
    ("\\boxed{8}. The final answer is 9", "9", False),
    ("So \\boxed{7}. Check: 3+4=7 and 12-5=7, so 12", "12", False),
    # a final box that is cut off (e.g. by the length limit) is no answer; the earlier closed box does not count
    ("\\boxed{5} hmm, actually \\boxed{6", "5", False),
    ("\\boxed{5} hmm, actually \\boxed{6", "6", False),
    ("\\boxed{5} and then \\boxed{}", "5", False),
    # forms of the box: \\fbox, the brace-less `\\boxed 5`, a space before the brace, nested and escaped braces
    ("\\boxed{2} then \\fbox{3}", "3", True),
    ("so the answer is $\\boxed 5$.", "5", True),
    ("\\boxed {12}", "12", True),
    ("\\boxed{\\frac{1}{\\sqrt{4}}}", "\\frac12", True),
    ("\\boxed{\\{1, 2\\}} after \\boxed{1}", "\\{1,2\\}", False),
    ("\\boxed{1} after \\boxed{\\{1, 2\\}}", "\\{1,2\\}", True),
    # no box at all: math-verify reads the whole response (the DAPO template's `Answer:` form)
    ("Answer: 17", "17", True),
]
ANSWER_TABLE = ANSWER_TABLE + LAST_BOX_TABLE
TABLE_IDS = [f"{i}:{resp[:30]}|{gold}" for i, (resp, gold, _) in enumerate(ANSWER_TABLE)]
RESULT_KEYS = {"score", "acc", "pred"}


#: The table checks what the grader decides, not how fast: a bound far above any answer's grading, so that a loaded
#: machine cannot turn a slow right answer into the time bound's "incorrect" (its own tests check the time bound).
TABLE_TIMEOUT_S = 120.0


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_answer_table(isolation):
    wrong = []
    for response, gold, expected in ANSWER_TABLE:
        result = compute_score("math500", response, gold, isolation=isolation, timeout_s=TABLE_TIMEOUT_S)
        if (result["acc"] == 1.0) != expected:
            wrong.append((response, gold, expected, result))
    assert not wrong, "\n".join(map(repr, wrong))


def test_result_shape_and_scores():
    right = compute_score("aime24", "so \\boxed{\\frac{1}{2}}", "0.5", {"index": 3})
    assert right == {"score": 1.0, "acc": 1.0, "pred": "\\frac{1}{2}"}
    wrong = compute_score("aime24", "so \\boxed{7}", "0.5", correct_score=1.0, incorrect_score=-1.0)
    assert wrong == {"score": -1.0, "acc": 0.0, "pred": "7"}
    none = compute_score("aime24", "no idea", "0.5")
    assert none == {"score": 0.0, "acc": 0.0, "pred": ""}
    # verl passes extra keyword arguments (e.g. reward_router_address); they are ignored
    assert compute_score("x", "\\boxed{1}", "1", reward_router_address=None)["score"] == 1.0


def test_ground_truth_forms():
    assert normalize_ground_truths("27") == ("27",)
    assert normalize_ground_truths(27) == ("27",)
    assert normalize_ground_truths(2.5) == ("2.5",)
    assert normalize_ground_truths(["1", 2]) == ("1", "2")
    assert normalize_ground_truths({"ground_truth": "3", "style": "rule"}) == ("3",)
    assert normalize_ground_truths(None) == ()
    assert normalize_ground_truths("  ") == ()
    # any of several references counts
    assert compute_score("x", "\\boxed{2}", ["1", "2"], isolation="inline")["acc"] == 1.0
    assert compute_score("x", "\\boxed{3}", ["1", "2"], isolation="inline")["acc"] == 0.0


def test_unknown_isolation_names_valid_values():
    with pytest.raises(ValueError, match="'threads'.*process, inline"):
        compute_score("x", "\\boxed{1}", "1", isolation="threads")


def test_last_boxed_extraction():
    from tepo_verl.reward.grader import last_boxed

    assert last_boxed("no box here") is None
    assert last_boxed("\\boxed{1} then \\boxed{2}") == "2"
    assert last_boxed("\\boxed{\\frac{a}{b}} x") == "\\frac{a}{b}"
    assert last_boxed("\\boxed{\\{1\\}}") == "\\{1\\}"  # escaped braces are content
    assert last_boxed("\\boxed{1} \\boxed{2") == ""  # the last box is cut off: no answer
    assert last_boxed("\\boxed 7 and more") == "7"
    assert last_boxed("\\boxed 7$.") == "7"
    assert last_boxed("\\fbox{3}") == "3"
    assert last_boxed("text \\boxed") == ""
    assert last_boxed("\\boxed{" * 50_000) == ""  # linear, no recursion


def test_default_time_bound_is_at_most_5_s_and_holds_for_a_hanging_input():
    """`9^{9^{9^{9}}}` makes sympy compute a huge power (C code, no Python timeout can interrupt it)."""
    import inspect

    from tepo_verl.reward.math_reward import DEFAULT_TIMEOUT_S

    assert DEFAULT_TIMEOUT_S <= 5.0
    assert inspect.signature(compute_score).parameters["timeout_s"].default == DEFAULT_TIMEOUT_S
    compute_score("x", "\\boxed{1}", "1")  # start the pool first: its one-off start is not charged to a call
    start = time.monotonic()
    result = compute_score("x", "\\boxed{9^{9^{9^{9}}}}", "9")  # the defaults
    elapsed = time.monotonic() - start
    assert result == {"score": 0.0, "acc": 0.0, "pred": ""}
    assert elapsed <= DEFAULT_TIMEOUT_S + 0.5, f"timed-out grading took {elapsed:.1f} s"
    assert compute_score("x", "\\boxed{7}", "7")["acc"] == 1.0  # a fresh worker replaced the killed one


def test_time_bound_includes_waiting_behind_a_stuck_grading():
    """With one worker stuck on a hanging input, a call queued behind it still returns within its own bound."""
    from tepo_verl.reward.pool import GraderTimeout

    pool = GraderPool(max_workers=1)
    try:
        pool.grade("\\boxed{1}", ("1",), 30.0)  # started
        with ThreadPoolExecutor(max_workers=2) as threads:
            stuck = threads.submit(pool.grade, "\\boxed{9^{9^{9^{9}}}}", ("9",), 3.0)
            time.sleep(0.3)
            start = time.monotonic()
            queued = threads.submit(pool.grade, "\\boxed{2}", ("2",), 1.0)
            with pytest.raises(GraderTimeout):
                queued.result()
            assert time.monotonic() - start < 1.5
            with pytest.raises(GraderTimeout):
                stuck.result()
        assert pool.grade("\\boxed{4}", ("4",), 30.0) == (True, "4")  # the worker was replaced
    finally:
        pool.close()


def test_no_silent_unbounded_fallback_when_workers_cannot_run(monkeypatch):
    import tepo_verl.reward.math_reward as math_reward

    class Broken:
        def grade(self, *args):
            raise OSError("no processes in this sandbox")

    monkeypatch.setattr(math_reward, "shared_pool", lambda: Broken())
    with pytest.raises(RuntimeError, match="no processes in this sandbox.*isolation='inline'"):
        compute_score("x", "\\boxed{1}", "1")
    assert compute_score("x", "\\boxed{1}", "1", isolation="inline")["acc"] == 1.0  # the explicit choice


def test_grading_works_outside_the_main_thread():
    """The bug this reward avoids: math-verify's default timeouts use signal.alarm, which works in the main thread
    only, and verl's reward manager calls the reward from a worker thread (tests/test_reward_verl.py)."""
    outcome = {}

    def in_thread():
        outcome["ours"] = [compute_score("x", "\\boxed{1}", "1", isolation=iso)["score"]
                           for iso in ("inline", "process")]

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(60)
    assert outcome["ours"] == [1.0, 1.0]


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_threads_agree_with_sequential(isolation):
    calls = [(resp, gold) for resp, gold, _ in ANSWER_TABLE] * 4
    # a generous time bound: this checks that threads grade alike, not the 5 s default (which a loaded CI can miss)
    sequential = [compute_score("x", resp, gold, isolation=isolation, timeout_s=120) for resp, gold in calls]
    with ThreadPoolExecutor(max_workers=8) as pool:
        concurrent = list(pool.map(lambda call: compute_score("x", *call, isolation=isolation, timeout_s=120), calls))
    assert concurrent == sequential


def test_pool_started_from_a_worker_thread():
    pool = GraderPool(max_workers=2)
    try:
        with ThreadPoolExecutor(max_workers=4) as threads:
            results = list(threads.map(lambda i: pool.grade(f"\\boxed{{{i}}}", (str(i),), 10.0), range(20)))
        assert results == [(True, str(i)) for i in range(20)]
    finally:
        pool.close()


# ---- fuzzing: any string, never an exception, always the same keys, bounded time ----------------------------------

_TOKENS = ["\\boxed{", "}", "{", "\\frac", "\\sqrt", "\\text{", "\\left(", "\\right)", "$", "$$", "\\(", "\\)",
           "\\[", "\\]", "^", "_", "=", ",", ".", "-", "+", "*", "/", "!", "\\%", "\\\\", "&", "\\begin{pmatrix}",
           "\\end{pmatrix}", "\\pi", "\\infty", "x", "y", "i", "e", "0", "1", "7", "99999", "1e308", "The answer is ",
           "Answer:", " ", "\n", "\\dfrac", "\\cdot", "\\times", "<", ">", "\\leq", "\\in", "\\cup", "[", "]", "(", ")"]
_ADVERSARIAL = [
    "\\boxed{" * 2000, "}" * 5000, "{" * 20000, "\\frac{" * 500 + "1" + "}{2}" * 500, "\\sqrt{" * 300 + "2" + "}" * 300,
    "\\boxed{9^{9^{9^{9}}}}", "\\boxed{10^{10^{10^{10}}}}", "\\boxed{99999!}", "\\boxed{" + "9" * 5000 + "}",
    "1" * 100_000, "$" * 30_000, "x" * 1_000_000 + "\\boxed{3}", "\\x00\x00\\boxed{1}\x00", "\ud800\\boxed{1}",
    "\\boxed{\\begin{pmatrix}" + "1&" * 400 + "1\\end{pmatrix}}", "((((((((((((((((((((((((((((((((((((((((1",
    "\\boxed{" + "x+" * 2000 + "1}", "Answer: " + "=" * 10_000, "\\boxed{\\frac{1}{0}}", "\\boxed{0^{-1}}",
    "\\boxed{\\log(0)}", "\\boxed{\\sqrt{-1}}", "\\boxed{1/0}", "\\text{" * 1000, "\\\\" * 10_000, "🙂" * 1000,
]


def _random_response(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        return "".join(rng.choice(_TOKENS) for _ in range(rng.randint(0, 60)))
    if kind < 0.97:
        return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 200)))
    adversarial = rng.choice(_ADVERSARIAL)  # a random prefix of one: each is also graded whole, once
    return adversarial[: rng.randint(1, len(adversarial))]


def test_fuzz_thousands_of_strings_never_raise_and_finish_in_time():
    """3000 seeded random responses (token soup, unicode, prefixes of the adversarial inputs) and every adversarial
    input whole, graded by 4 threads in process isolation.

    Every call returns the fixed keys and a score of 0 or 1, and the run ends: the sympy bombs that the random and
    adversarial inputs contain (such as `9^{9^{9^{9}}}`) would not end without the grader's time bound. The bound
    below catches a hang, not slowness: the run takes about 5 s on 2 cores (~3 ms a call, plus up to the 1 s
    timeout for each bomb) and was seen at 110 s beside a training run; its speed is not this test's subject.
    """
    rng = random.Random(20260601)
    golds = ["1", "\\frac{1}{2}", "3", "x+1", "\\pi", "(1,2)"]
    cases = [(_random_response(rng), rng.choice(golds)) for _ in range(3000)] + [(a, "1") for a in _ADVERSARIAL]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: compute_score("fuzz", c[0], c[1], timeout_s=1.0), cases))
    elapsed = time.monotonic() - start
    assert elapsed < 900.0, f"fuzz run took {elapsed:.1f} s: a call hung past its time bound"
    for result in results:
        assert set(result) == RESULT_KEYS
        assert result["score"] in (0.0, 1.0) and result["acc"] == result["score"]
        assert isinstance(result["pred"], str)


# No '^' or '!': huge powers and factorials would hang the inline (unbounded) grader that this test compares with.
_SAFE_ALPHABET = st.sampled_from([t for t in _TOKENS if t not in ("^", "!", "1e308", "99999")] + list("0123456789"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    response=st.lists(_SAFE_ALPHABET, max_size=30).map("".join) | st.text(max_size=80),
    gold=st.sampled_from(["1", "\\frac{1}{2}", "x+1", "(1,2)", "7"]),
)
def test_process_and_inline_grading_agree(response, gold):
    """Isolation changes where grading runs, never its verdict."""
    inline = grade_response(response, gold, isolation="inline")
    process = grade_response(response, gold, isolation="process", timeout_s=30.0)
    assert process == inline


def test_response_cap_keeps_the_tail():
    long = "blah " * 20_000 + "so \\boxed{6}"
    assert compute_score("x", long, "6", max_response_chars=100)["acc"] == 1.0
    assert compute_score("x", "\\boxed{6}" + "blah " * 100, "6", max_response_chars=50)["acc"] == 0.0


def test_verl_loads_it_as_custom_reward_function():
    """verl's own loader (`reward.custom_reward_function`) finds and calls it, with reward_kwargs merged in."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://tepo_verl.reward.math_reward",
                    "name": "compute_score",
                    "reward_kwargs": {"incorrect_score": -1.0},
                }
            }
        }
    )
    fn = get_custom_reward_fn(config)
    kwargs = {"data_source": "aime24", "ground_truth": "204", "extra_info": {"index": 0}}
    assert fn(solution_str="... \\boxed{204}", **kwargs) == {"score": 1.0, "acc": 1.0, "pred": "204"}
    assert fn(solution_str="... \\boxed{205}", **kwargs)["score"] == -1.0
