#!/usr/bin/env python3
"""Fails on an #include from a lower layer into a higher one.

The rule is the README's Layers table: its rows, bottom layer first, name each layer's folder.
A file under a layer's folder (the longest folder that matches) may include headers of its own
layer and of the layers listed before it, never of one listed after it. Folders the table does
not name (examples, bench, tests, fuzz) sit above every layer and are not checked.

usage: check_layers.py <source root>
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
ROW = re.compile(r'^\|\s*`([^`]+)`\s*\|\s*`([^`]+)/`\s*\|')


def layers_from_readme(text):
    """[(folder, rank)] from the README's '## Layers' table, bottom layer first."""
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    folders = [m.group(2) for line in section.splitlines() if (m := ROW.match(line))]
    if len(folders) < 3:
        raise SystemExit("check_layers: no Layers table with `layer` | `folder/` rows in README.md")
    return [(f, rank) for rank, f in enumerate(folders)]


def layer_of(path, layers):
    best = None
    for folder, rank in layers:
        if path.startswith(folder + "/") and (best is None or len(folder) > len(best[0])):
            best = (folder, rank)
    return best


def violations(files, layers):
    """files: {path: text}. Yields 'file: includes header (layer a below layer b)'."""
    for path, text in sorted(files.items()):
        mine = layer_of(path, layers)
        if mine is None:
            continue
        for header in INCLUDE.findall(text):
            theirs = layer_of(header, layers)
            if theirs is not None and theirs[1] > mine[1]:
                yield (f"{path}: includes \"{header}\": {mine[0]}/ is below {theirs[0]}/ "
                       "in the README's Layers table")


def main(root):
    layers = layers_from_readme(open(os.path.join(root, "README.md"), encoding="utf-8").read())
    # The check itself must catch a violation, or a broken parser would pass everything.
    probe = {layers[0][0] + "/probe.cpp": f'#include "{layers[-1][0]}/x.h"\n'}
    if not list(violations(probe, layers)):
        raise SystemExit("check_layers: the self-test found no violation in a known-bad file")
    files = {}
    for folder, _ in layers:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for n in names:
                if n.endswith((".h", ".cpp", ".cu", ".cuh")):
                    full = os.path.join(dirpath, n)
                    files[os.path.relpath(full, root)] = open(full, encoding="utf-8").read()
    bad = list(violations(files, layers))
    for line in bad:
        print(line)
    print(f"check_layers: {len(files)} files, {len(layers)} layers, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
