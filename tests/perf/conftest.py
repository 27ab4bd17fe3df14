import pytest

from sparkgate.measure import local_copy_bandwidth_gbs, roofline_tok_s


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
def record(results, recipe, check):
    """Print a figure (with n, std and roofline share) and keep it in the results file."""

    def keep(figure):
        print(f"{recipe.name} [{check.id}]: {figure}")
        if results:
            results.add(figure, recipe, check.id)
        return figure

    return keep


@pytest.fixture
def completed(check):
    """The records of a shape, every one of which must have completed and be timeable: a figure over the
    survivors of a failing batch would pass a floor the failures never met."""

    def judge(records, what="request"):
        bad = [f"{what} {i}: {r.error or f'{r.completion_tokens} tokens, nothing to time'}"
               for i, r in enumerate(records) if r.error or r.decode_tok_s is None]
        check.that(not bad, expected=f"every {what} completes with at least 2 timed tokens",
                   found=f"{len(bad)} of {len(records)} did not: " + "; ".join(bad[:4]),
                   fix="read the server log for the failed requests: errors under load are a server defect, "
                       "before any speed figure means anything")
        return records

    return judge
