# sourced by the deployment recipes: recovered_label OUT.pt -> "-eN", N the epochs `recover` ran for OUT.pt (its
# record OUT.json), nothing for a checkpoint recover did not write; the table's row names say how long each trained
recovered_label() {
  python - "${1%.pt}.json" <<'PY'
import json, os, sys
record = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {}
print("-e%d" % len(record["epochs"]) if "epochs" in record else "")
PY
}
