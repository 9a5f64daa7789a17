#!/usr/bin/env python3
"""The test oracle for fp8moe's Jinja interpreter: renders chat templates with jinja2 in the environment
transformers' apply_chat_template uses (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
its tojson / raise_exception / strftime_now, the {% generation %} tag), with strftime_now pinned to a fixed time.

stdin: a JSON list of {"template": TEXT, "vars": {...}}; stdout: a JSON list, one per job, of {"text": RENDERED},
{"raised": MESSAGE} (raise_exception) or {"error": MESSAGE} (any other failure, the syntax included)."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = 1753920000  # 2025-07-31 00:00:00 UTC; the C test passes the same time


class Raised(Exception):
    pass


class Generation(Extension):
    """transformers' AssistantTracker, less the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.fromtimestamp(FIXED_NOW).strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = environment()
    out = []
    cache = {}
    for job in json.load(sys.stdin):
        try:
            t = cache.get(job["template"])
            if t is None:
                t = cache[job["template"]] = env.from_string(job["template"])
            out.append({"text": t.render(**job.get("vars", {}))})
        except Raised as e:
            out.append({"raised": str(e.args[0]) if e.args else ""})
        except Exception as e:  # noqa: BLE001 - every other failure is one outcome for the comparison
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
