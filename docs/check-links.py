#!/usr/bin/env python3
"""Every relative link in README.md and docs/*.md resolves to an existing file, every #anchor
to a heading of its target (GitHub's slugs), and every repository path in a code span
(`src/...`, `lua/...`, `tests/...`, ...) to a file or folder that exists: a file that moved
leaves no stale path behind."""
import os, re, sys, glob
root = sys.argv[1] if len(sys.argv) > 1 else '.'
files = [os.path.join(root, 'README.md')] + sorted(glob.glob(os.path.join(root, 'docs', '*.md')))
link = re.compile(r'(?<!\!)\[[^\]]*\]\(([^)\s]+)\)')
def strip_code(text):
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    return re.sub(r'`[^`\n]*`', '', text)
def slug(h):
    h = h.strip().lower()
    h = re.sub(r'[^\w\- ]', '', h)
    return h.replace(' ', '-')
def anchors(path):
    out, seen = set(), {}
    text = re.sub(r'```.*?```', '', open(path).read(), flags=re.S)
    for m in re.finditer(r'^#{1,6}\s+(.*)$', text, flags=re.M):
        s = slug(m.group(1).replace('`', ''))
        n = seen.get(s, 0); seen[s] = n + 1
        out.add(s if n == 0 else f'{s}-{n}')
    return out
bad = 0; count = 0
for f in files:
    text = strip_code(open(f).read())
    for m in link.finditer(text):
        target = m.group(1)
        if re.match(r'^[a-z]+:', target):
            continue
        count += 1
        path, _, frag = target.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        if not os.path.exists(dest):
            print(f'{f}: {target}: no such file'); bad += 1; continue
        if frag and dest.endswith('.md') and frag not in anchors(dest):
            print(f'{f}: {target}: no heading #{frag}'); bad += 1
code_span = re.compile(r'`([^`\n]+)`')
repo_path = re.compile(r'^(src|lua|tests|migrations|benches|loadtest|deploy|docs)/[\w./*-]*$')
paths = 0
for f in files:
    text = re.sub(r'```.*?```', '', open(f).read(), flags=re.S)
    for m in code_span.finditer(text):
        p = m.group(1)
        if not repo_path.match(p):
            continue
        paths += 1
        found = glob.glob(os.path.join(root, p)) if '*' in p else os.path.exists(os.path.join(root, p))
        if not found:
            print(f'{f}: `{p}`: no such file or folder'); bad += 1
print(f'{count} relative links and {paths} repository paths in {len(files)} files, {bad} broken')
sys.exit(1 if bad else 0)
