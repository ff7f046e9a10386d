"""Render a checkpoint's chat template with limits, in a child process: ``render_turn``.

A chat template is a program from the model folder. transformers renders it in jinja2's
``ImmutableSandboxedEnvironment``, which stops it reaching Python's internals but not using up time or memory: two
nested loops of ``range(100000)`` never end, and ``'x' * 3000000000`` takes 3 GB in one C call that nothing
inside the process can interrupt. So the engine renders it once, at load, in a short-lived child process that
runs transformers' own renderer (``render_jinja_template``, as ``apply_chat_template`` does) under
``RENDER_CPU_S`` seconds of CPU and ``RENDER_MEMORY_BYTES`` of address space more than it holds after its imports
(``resource`` limits, which the kernel enforces on C calls too), and answers at most ``MAX_RENDERED_CHARS``. A
template past a limit is refused as a ``TemplateLimitError`` naming the limit; the engine's own memory and time are
never at stake. Why not in-process: a thread cannot be stopped from outside, and a trace function or intercepted
operators cannot stop one C call's allocation. The cost is one process start (about a second, transformers'
import) when a chat checkpoint loads; FIM checkpoints render nothing.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
from typing import Any, cast

RENDER_CPU_S = 5
"""CPU seconds the rendering itself may take (a real template takes milliseconds)."""
RENDER_MEMORY_BYTES = 512 << 20
"""Address space the rendering may add (a real template's output is a few hundred bytes)."""
MAX_RENDERED_CHARS = 1 << 16
"""The longest rendered turn accepted (the release's frame around one user message is under 100 characters)."""
WALL_TIMEOUT_S = 300.0
"""The child is killed after this long in all (its import and a loaded machine included): a backstop only."""
MAX_ERROR_CHARS = 2_000


class TemplateLimitError(ValueError):
    """A chat template that fails, or exceeds a limit, when rendered."""


def render_turn(template: str, variables: dict[str, Any], content: str) -> str:
    """``template`` rendered for one user message ``content`` with the generation prompt, as ``apply_chat_template``
    renders it (``variables``: the tokenizer's special tokens and template kwargs), in a limited child process.
    The same template with the same values renders once per process (as transformers compiles it once)."""
    return _render(
        json.dumps(
            {
                "template": template,
                "variables": variables,
                "content": content,
                "cpu_s": RENDER_CPU_S,
                "memory_bytes": RENDER_MEMORY_BYTES,
                "max_chars": MAX_RENDERED_CHARS,
            },
            default=str,
            sort_keys=True,
        )
    )


@functools.lru_cache(maxsize=16)
def _render(job: str) -> str:
    """The child's answer to ``job`` (a JSON object: template, values, limits); a refusal is raised, not kept."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__],
            input=job.encode(),
            capture_output=True,
            timeout=WALL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TemplateLimitError(f"the chat template did not finish rendering within {WALL_TIMEOUT_S:.0f} s") from None
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise TemplateLimitError(f"the chat template took more than {RENDER_CPU_S} s of CPU to render")
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        detail = done.stderr.decode(errors="replace")[-MAX_ERROR_CHARS:].strip()
        raise TemplateLimitError(
            f"rendering the chat template ended with status {done.returncode}: {detail or 'no message'}"
        ) from None
    if "error" in answer:
        raise TemplateLimitError(str(answer["error"])[:MAX_ERROR_CHARS])
    return str(answer["rendered"])


def _limit_self(cpu_s: int, memory_bytes: int) -> None:
    """The child's own limits, set after its imports: CPU seconds from now, address space over what it holds now."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime) + cpu_s
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 2))  # SIGXCPU at the soft limit, SIGKILL at the hard
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        with open("/proc/self/statm") as statm:  # Linux: the address space in pages
            held = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (held + memory_bytes, resource.RLIM_INFINITY))
    except (OSError, ValueError):  # macOS has no /proc and does not enforce RLIMIT_AS: the CPU limit bounds it
        pass


def _out_of_time(signum: int, frame: object) -> None:
    raise TimeoutError


def _child() -> None:
    """Read one job on stdin, render it under its limits, write ``{"rendered"}`` or ``{"error"}`` on stdout."""
    from transformers.utils.chat_template_utils import render_jinja_template

    job = json.loads(sys.stdin.read())
    signal.signal(signal.SIGXCPU, _out_of_time)
    _limit_self(int(job["cpu_s"]), int(job["memory_bytes"]))
    try:
        rendered, _ = cast(  # transformers annotates it as a str; it returns (texts, generation indices)
            tuple[list[str], object],
            render_jinja_template(
                conversations=[[{"role": "user", "content": job["content"]}]],
                chat_template=job["template"],
                add_generation_prompt=True,
                **job["variables"],
            ),
        )
        text = str(rendered[0])
        if len(text) > job["max_chars"]:
            answer = {"error": f"the chat template renders {len(text)} characters, more than {job['max_chars']}"}
        else:
            answer = {"rendered": text}
    except TimeoutError:
        answer = {"error": f"the chat template took more than {job['cpu_s']} s of CPU to render"}
    except MemoryError:
        answer = {"error": f"the chat template needs more than {job['memory_bytes'] >> 20} MiB to render"}
    except RecursionError:
        answer = {"error": "the chat template recurses too deeply"}
    except Exception as exc:  # noqa: BLE001 - any fault of the template is the template's, reported as such
        answer = {"error": f"the chat template fails to render: {type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    _child()
