"""The recipes in deploy/ (a compose file, a KubeRay RayJob, their Dockerfile) cannot run here (no
container runtime, no Kubernetes): this checks that every `pipeline` command in them uses only
subcommands and options the CLI has, and that their images and `ray start` commands are the ones
the docs name (docs/scaling.md)."""

from __future__ import annotations

import shlex

import yaml

from conftest import REPO
from pipeline.cli import main

DEPLOY = REPO / "deploy"


def commands() -> list[str]:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    job = yaml.safe_load((DEPLOY / "rayjob.yaml").read_text())
    found = [service["command"] for service in compose["services"].values() if "command" in service]
    found.append(job["spec"]["entrypoint"])
    comments = [
        line.lstrip("# ").rstrip("\\ ")
        for line in (DEPLOY / "compose.yaml").read_text().splitlines()
        if line.startswith("#")
    ]
    joined = " ".join(comments)  # the usage lines in the header, continuation lines joined
    found += [
        "pipeline " + part.split(" --tracking-uri")[0]
        for part in joined.split("pipeline ")[1:]
        if part.startswith(("run ", "server "))
    ]
    return found


def test_every_pipeline_command_in_the_recipes_is_one_the_cli_takes():
    checked = 0
    for command in commands():
        words = shlex.split(command.replace("${PIPELINE_DB_PASSWORD}", "secret"))
        if words[0] != "pipeline":
            continue
        sub = main.commands.get(words[1])
        assert sub is not None, f"pipeline {words[1]}: no such command ({command})"
        options = {opt for param in sub.params for opt in param.opts}
        unknown = [w.split("=")[0] for w in words[2:] if w.startswith("--") and w.split("=")[0] not in options]
        assert not unknown, f"pipeline {words[1]} has no {unknown} ({command})"
        checked += 1
    assert checked >= 3  # the server, the RayJob's sweep, the compose usage line


def test_the_recipes_images_and_ray_commands_are_the_readmes():
    readme = (REPO / "docs" / "scaling.md").read_text()
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    job = (DEPLOY / "rayjob.yaml").read_text()
    images = {service["image"] for service in compose["services"].values()}
    assert images == {"pipeline:latest", "postgres:16"} and "image: pipeline:latest" in job
    assert all(f"`{image}`" in readme for image in images)
    ray = [s["command"] for s in compose["services"].values() if s.get("command", "").startswith("ray ")]
    assert ray and all(f"`{command}`" in readme for command in ray), ray
    assert "docker build -f deploy/Dockerfile -t pipeline:latest ." in readme
