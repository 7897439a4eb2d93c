# sourced by the deployment recipes: recovered_label OUT.pt -> "-eN", N the epochs `recover` ran for OUT.pt (its
# record OUT.json), nothing for a checkpoint recover did not write; the table's row names say how long each trained
recovered_label() {
  python -c 'import json, sys; r = json.load(open(sys.argv[1])); print("-e%d" % len(r["epochs"]) if "epochs" in r else "")' \
    "${1%.pt}.json"
}
