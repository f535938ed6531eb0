#!/usr/bin/env python3
"""Fails on an #include from a lower layer into a higher one, and on a cycle of includes between
the parts of one layer.

The rule is the README's Layers table: its rows, bottom layer first, name each layer's folder.
A file under a layer's folder (the longest folder that matches) may include headers of its own
layer and of the layers listed before it, never of one listed after it. Within a layer, its
parts — each sub-folder (dist/optim, dist/checkpoint, core/cpu, ...) and each file at the
layer's root — must include each other without a cycle, so that each can be read before the
ones that use it. Folders the table does not name (examples, bench, tests, fuzz) sit above
every layer and are not checked.

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


def part_of(path, layer):
    """The part of its layer a file belongs to: its sub-folder ("dist/optim"), or itself when it
    sits at the layer's root ("dist/init_rpc.h")."""
    rest = path[len(layer) + 1:].split("/")
    return layer + "/" + rest[0] if len(rest) > 1 else path


def cycles(files, layers):
    """Yields each include cycle between the parts of one layer, as 'a -> b -> a'."""
    edges = {}
    for path, text in files.items():
        mine = layer_of(path, layers)
        if mine is None:
            continue
        src = part_of(path, mine[0])
        for header in INCLUDE.findall(text):
            if layer_of(header, layers) != mine:
                continue
            dst = part_of(header, mine[0])
            if dst != src:
                edges.setdefault(src, set()).add(dst)
    # Depth-first search; a back edge closes a cycle. Each cycle is reported once, by its
    # smallest rotation.
    seen, reported = set(), set()

    def visit(node, stack):
        if node in stack:
            cycle = stack[stack.index(node):]
            key = min(tuple(cycle[i:] + cycle[:i]) for i in range(len(cycle)))
            if key not in reported:
                reported.add(key)
                yield " -> ".join(list(key) + [key[0]])
            return
        if node in seen:
            return
        seen.add(node)
        for nxt in sorted(edges.get(node, ())):
            yield from visit(nxt, stack + [node])

    for node in sorted(edges):
        yield from visit(node, [])


def main(root):
    layers = layers_from_readme(open(os.path.join(root, "README.md"), encoding="utf-8").read())
    # The check itself must catch a violation, or a broken parser would pass everything.
    probe = {layers[0][0] + "/probe.cpp": f'#include "{layers[-1][0]}/x.h"\n'}
    if not list(violations(probe, layers)):
        raise SystemExit("check_layers: the self-test found no violation in a known-bad file")
    top = layers[-1][0]
    probe = {f"{top}/a/x.h": f'#include "{top}/b/y.h"\n', f"{top}/b/y.h": f'#include "{top}/a/x.h"\n'}
    if not list(cycles(probe, layers)):
        raise SystemExit("check_layers: the self-test found no cycle in a known cycle")
    files = {}
    for folder, _ in layers:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for n in names:
                if n.endswith((".h", ".cpp", ".cu", ".cuh")):
                    full = os.path.join(dirpath, n)
                    files[os.path.relpath(full, root)] = open(full, encoding="utf-8").read()
    bad = list(violations(files, layers))
    bad += [f"include cycle between the parts of a layer: {c}" for c in cycles(files, layers)]
    for line in bad:
        print(line)
    print(f"check_layers: {len(files)} files, {len(layers)} layers, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
