#!/usr/bin/python3
"""Validates generated texts against their JSON Schemas with python3-jsonschema (the independent oracle of
tests/test_structured_outputs.c). Input: a JSON file, a list of {"schema": ..., "output": "<text>"}. Prints one line
per invalid case and exits 1 when any is invalid (2 when the module is missing)."""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed (tools/install-deps.sh installs it)")
    sys.exit(2)

bad = 0
cases = json.load(open(sys.argv[1], encoding="utf-8"))
for i, c in enumerate(cases):
    try:
        value = json.loads(c["output"])
        jsonschema.validate(value, c["schema"], cls=jsonschema.Draft202012Validator)
    except Exception as e:  # any failure is a finding: print it with its case
        bad += 1
        print(f"case {i}: {type(e).__name__}: {str(e).splitlines()[0]}\n  schema {json.dumps(c['schema'])}\n"
              f"  output {c['output']!r}")
print(f"{len(cases)} outputs checked, {bad} invalid")
sys.exit(1 if bad else 0)
