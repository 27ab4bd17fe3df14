"""`sparkgate`: read recipes before anything runs.

  sparkgate recipes list            every recipe, its profile and model
  sparkgate recipes show NAME       the exact command line or `docker run` the recipe would start
  sparkgate prepare NAME            convert an embedded model into the cache now (otherwise done at start)
  sparkgate results-schema          the JSON Schema of --results-json files (docs/results.schema.json)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .launch.base import cache_dir
from .launch.container_spec import docker_run
from .launch.process_launcher import ProcessLauncher
from .recipes import RECIPES_DIR, Recipe, RecipeError, load_recipes
from .redact import mask, secrets_of


def describe(recipe: Recipe) -> str:
    """The exact command line or `docker run` the recipe would start, secrets masked."""
    return docker_run(recipe) if recipe.launcher == "docker" else ProcessLauncher(recipe).describe()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkgate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    recipes = sub.add_parser("recipes", help="list recipes or show what one would start")
    rsub = recipes.add_subparsers(dest="action", required=True)
    listing = rsub.add_parser("list")
    show = rsub.add_parser("show")
    show.add_argument("name")
    prep = sub.add_parser("prepare", help="convert an embedded model into the cache")
    prep.add_argument("name")
    for p in (listing, show, prep):
        p.add_argument("--recipes-dir", default=str(RECIPES_DIR), metavar="DIR",
                       help=f"where recipes are read from (default: {RECIPES_DIR})")
    sub.add_parser("results-schema", help="print the JSON Schema of --results-json files")
    args = parser.parse_args(argv)
    if args.cmd == "results-schema":
        from .results import Results

        print(json.dumps(Results.model_json_schema(), indent=2))
        return 0
    try:
        all_recipes = load_recipes(Path(args.recipes_dir))
    except RecipeError as exc:
        print(f"sparkgate: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "recipes" and args.action == "list":
        for r in all_recipes.values():
            print(f"{r.name:24} {r.profile:6} {r.launcher:8} {r.model.id}")
        return 0
    recipe = all_recipes.get(args.name)
    if recipe is None:
        print(f"sparkgate: no recipe {args.name!r} (have: {', '.join(all_recipes)})", file=sys.stderr)
        return 2
    if args.cmd == "prepare":
        if not recipe.model.source:
            print(f"sparkgate: {recipe.name} has no embedded model to prepare", file=sys.stderr)
            return 2
        from .embedded import prepare

        print(prepare(recipe.model.source, cache_dir()))
        return 0
    secrets_of(recipe.env, recipe.serve_args)
    print(mask(f"# {recipe.name}: {recipe.description}"))
    print(mask(f"# memory budget {recipe.memory.budget_gib:.1f} GiB: {recipe.memory.basis.strip()}"))
    print(describe(recipe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
