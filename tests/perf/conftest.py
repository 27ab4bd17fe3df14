import pytest

from sparkgate.checks import Check
from sparkgate.compare import ALPHA, compare_figure, key
from sparkgate.measure import METHOD, Target, local_copy_bandwidth_gbs, method_of, roofline_tok_s
from sparkgate.plugin import STATE
from sparkgate.tokens import counter_for


@pytest.fixture(scope="session")
def bandwidth(sparkgate_state):
    """Memory bandwidth per profile: the published figure, or this machine's copy bandwidth, measured,
    when the target is this machine and the profile publishes none (the CPU profile)."""
    measured = {}

    def of(profile):
        if profile.memory_bandwidth_gbs:
            return profile.memory_bandwidth_gbs, f"profile {profile.name}"
        if sparkgate_state.target == "local":
            if "local" not in measured:
                measured["local"] = local_copy_bandwidth_gbs()
            if measured["local"]:
                return measured["local"], "this machine's copy bandwidth, measured (best of 5)"
        return None, f"profile {profile.name} publishes no memory bandwidth"

    return of


@pytest.fixture
def roofline(recipe, sparkgate_state, bandwidth):
    """The decode ceiling of this recipe: every active weight read once per token."""
    gbs, basis = bandwidth(sparkgate_state.profiles[recipe.profile])
    ceiling = roofline_tok_s(gbs, recipe.model.active_params_b, recipe.model.bytes_per_param)
    m = recipe.model
    print(f"{recipe.name} roofline: " + (f"{ceiling:.1f} tok/s = {gbs:.1f} GB/s ({basis}) / ({m.active_params_b:g}B "
                                         f"active x {m.bytes_per_param:g} bytes)" if ceiling else f"unknown: {basis}"))
    return ceiling


@pytest.fixture
def target(server, recipe):
    """Where the perf checks send their requests: the server, its key, and the model's tokenizer for a server
    whose streams carry no usage (loaded only if one is met)."""
    counter = []

    def count(text):
        if not counter:
            counter.append(counter_for(recipe))
        if counter[0] is None:
            raise LookupError(f"no tokenizer of {recipe.model.id} is at hand here (the local Hugging Face cache)")
        return counter[0](text)

    return Target(server.base_url, server.headers, count)


class _Method:
    value = METHOD


@pytest.fixture
def method():
    """The method of this check's figures: the server's token count, or the tokenizer's where it had none."""
    return _Method()


BASELINE_REGRESSIONS = pytest.StashKey[list]()


@pytest.fixture
def record(sparkgate_state, recipe, check, method, request):
    """Print a figure (with n, std and roofline share) and keep it, with the floor it is held to (a recipe's floor
    by name, or a bare minimum), for the report, the summary and the results file. With --baseline, the figure is
    also compared with the baseline's (sparkgate.compare's rule); a significant regression fails the check after
    its own verdict."""

    def keep(figure, floor=None):
        if figure.method == METHOD:
            figure.method = method.value
        print(f"{recipe.name} [{check.id}]: {figure}")
        name = floor if isinstance(floor, str) and floor in recipe.floors else None
        minimum = recipe.floors[name].min if name else None if isinstance(floor, str) else floor
        measured = sparkgate_state.record_figure(figure, recipe, check.id, request.node.nodeid, minimum, name)
        if sparkgate_state.baseline is not None:
            problem = against_baseline(sparkgate_state.baseline, measured, request.config.option.sg_tolerance)
            if problem:
                request.node.stash.setdefault(BASELINE_REGRESSIONS, []).append(problem)
        return figure

    return keep


def against_baseline(baseline, measured, tolerance_pct):
    """What is wrong with `measured` against the baseline's figure of the same recipe, check and name, by
    sparkgate.compare's rule: a significant regression, or a figure measured differently; None when nothing is
    (or the baseline lacks it)."""
    base = next((m for m in baseline.measurements if key(m) == key(measured)), None)
    if base is None:
        print("  against the baseline: not in it")
        return None
    if base.shape != measured.shape or base.method != measured.method:
        return (f"{measured.name} not comparable: the baseline measured it differently (shape {base.shape.key()}, "
                f"method {base.method!r}); this run: {measured.shape.key()}, {measured.method!r}")
    verdict = compare_figure(base, measured, tolerance_pct)
    print(f"  against the baseline: {verdict.describe()}: {verdict.verdict}")
    return verdict.describe() if verdict.regressed else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """--baseline: a check whose own verdict passed still fails on a significant regression against the baseline
    (one failure naming every such figure); a check that failed on its own keeps that failure."""
    result = yield
    problems = item.stash.get(BASELINE_REGRESSIONS, [])
    if problems:
        state = item.config.stash[STATE]
        option = item.config.option
        pytest.fail(Check.of(item).message(
            expected=f"no figure significantly worse than in the baseline {option.sg_baseline} (more than "
                     f"{option.sg_tolerance:g}% slower, beyond the noise of both: Welch's t-test, p < {ALPHA:g})",
            found="; ".join(problems),
            why=f"the baseline is this box before the change ({_baseline_of(state.baseline)}); a figure that got "
                "significantly worse is what the change did to every user, even above the floor",
            fix="keep the previous image or flags (the baseline's image and serving digest are in its results "
                "file); `sparkgate compare BASELINE CANDIDATE` shows every figure side by side. A figure measured "
                "differently: make the baseline again with this version of the suite"), pytrace=False)
    return result


def _baseline_of(baseline):
    images = ", ".join(f"{r.recipe}: {r.image or 'process'}" for r in baseline.recipes)
    return f"{images}; sparkgate {baseline.suite.version}, {baseline.started}"


@pytest.fixture
def completed(check, method):
    """The records of a shape, every one of which must have completed and be timeable: a figure over the
    survivors of a failing batch would pass a floor the failures never met."""

    def judge(records, what="request"):
        uncountable = [r for r in records if r.error and "no tokenizer" in r.error]
        if uncountable:
            check.cannot_run(f"the server's streams carry no usage chunk, so its tokens must be counted here, and "
                             f"{uncountable[0].error.split(', and ')[-1]}",
                             "have the model's tokenizer in the local Hugging Face cache")
        bad = [f"{what} {i}: {r.error or f'{r.completion_tokens} tokens, nothing to time'}"
               for i, r in enumerate(records) if r.error or r.decode_tok_s is None]
        check.that(not bad, expected=f"every {what} completes with at least 2 timed tokens",
                   found=f"{len(bad)} of {len(records)} did not: " + "; ".join(bad[:4]),
                   fix="read the server log for the failed requests: errors under load are a server defect, "
                       "before any speed figure means anything")
        if method_of(records) != METHOD:
            method.value = method_of(records)
        return records

    return judge
