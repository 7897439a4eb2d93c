"""Compare the rows of two report folders (before/after the restructure)."""
import json
import sys

old, new = sys.argv[1], sys.argv[2]


def rows(path):
    lines = [json.loads(line) for line in open(path)]
    return {r["key"]: r for r in lines[1:]}


def same(a, b, fields):
    bad = []
    for k in sorted(set(a) | set(b), key=str):
        ra, rb = a.get(k), b.get(k)
        if ra is None or rb is None:
            bad.append((k, "missing"))
            continue
        for f in fields:
            if ra.get(f) != rb.get(f):
                bad.append((k, f, ra.get(f), rb.get(f)))
    return bad


for name, fields in [("ablation-single.jsonl", ["bleu", "delta", "p_value", "significant", "hypotheses_sha256"]),
                     ("ablation-keep-one-loss.jsonl", ["nll", "delta"]),
                     ("ablation-keep-one-loss-report-test-bleu.jsonl", ["bleu", "delta", "p_value", "significant"]),
                     ("pruning.jsonl", ["bleu", "masked", "heads_masked"])]:
    a, b = rows(f"{old}/{name}"), rows(f"{new}/{name}")
    bad = same(a, b, fields)
    print(f"{name}: {len(a)} rows old, {len(b)} new, {len(bad)} differences", bad[:3])
ia, ib = json.load(open(f"{old}/importance.json")), json.load(open(f"{new}/importance.json"))
print("importance equal:", all(ia[t] == ib[t] for t in ("enc-self", "enc-dec", "dec-self")))
aa, ab = json.load(open(f"{old}/heads_analysis.json")), json.load(open(f"{new}/heads_analysis.json"))
print("analysis per-head equal:", all(aa[t] == ab[t] for t in ("enc-self", "enc-dec", "dec-self")),
      "summary equal:", aa["summary"] == ab["summary"])
ca, cb = json.load(open(f"{old}/claims.json")), json.load(open(f"{new}/claims.json"))
for x, y in zip(ca["claims"], cb["claims"]):
    print(x["id"], x["verdict"], "|", y["verdict"], "| ours equal:", x["ours"] == y["ours"],
          "" if x["ours"] == y["ours"] else f"\n   old: {x['ours']}\n   new: {y['ours']}")
