import pytest

from sparkgate.measure import METHOD, Target, local_copy_bandwidth_gbs, method_of, roofline_tok_s
from sparkgate.tokens import counter_for


@pytest.fixture(scope="session")
def bandwidth(target_name):
    """Memory bandwidth per profile: the published figure, or this machine's copy bandwidth, measured,
    when the target is this machine and the profile publishes none (the CPU profile)."""
    measured = {}

    def of(profile):
        if profile.memory_bandwidth_gbs:
            return profile.memory_bandwidth_gbs, f"profile {profile.name}"
        if target_name == "local":
            if "local" not in measured:
                measured["local"] = local_copy_bandwidth_gbs()
            if measured["local"]:
                return measured["local"], "this machine's copy bandwidth, measured (best of 5)"
        return None, f"profile {profile.name} publishes no memory bandwidth"

    return of


@pytest.fixture
def roofline(recipe, recipe_profile, bandwidth):
    """The decode ceiling of this recipe: every active weight read once per token."""
    gbs, basis = bandwidth(recipe_profile)
    # Split over tensor-parallel GPUs (two Sparks: one each), each reads its share of the weights per token.
    tp = recipe.tensor_parallel
    ceiling = roofline_tok_s(gbs and gbs * tp, recipe.model.active_params_b, recipe.model.bytes_per_param)
    m = recipe.model
    print(f"{recipe.name} roofline: " + (f"{ceiling:.1f} tok/s = {gbs:.1f} GB/s ({basis})"
                                         + (f" x {tp} GPUs in tensor parallel" if tp > 1 else "")
                                         + f" / ({m.active_params_b:g}B active x {m.bytes_per_param:g} bytes)"
                                         if ceiling else f"unknown: {basis}"))
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


@pytest.fixture
def record(recipe, check, method, keep_figure, one_node):
    """Print a figure (with n, std and roofline share) and keep it, with the floor it is held to (a recipe's floor
    by name, or a bare minimum), for the report, the summary and the results file; with --baseline it is also held
    to the baseline's figure (a significant regression fails the check after its own verdict). A two-node recipe's
    figure is printed beside the one-box figure of the same model (its one-node twin's floor of that name)."""

    def keep(figure, floor=None):
        if figure.method == METHOD:
            figure.method = method.value
        alone = one_node.floors.get(floor) if one_node and isinstance(floor, str) else None
        print(f"{recipe.name} [{check.id}]: {figure}"
              + (f"; on one box ({one_node.name}): {alone.measured} ({alone.source})" if alone else ""))
        name = floor if isinstance(floor, str) and floor in recipe.floors else None
        minimum = recipe.floors[name].min if name else None if isinstance(floor, str) else floor
        keep_figure(figure, minimum, name)
        return figure

    return keep


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
