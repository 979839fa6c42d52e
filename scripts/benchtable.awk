# Prints `go test -bench` results side by side: each benchmark against the first
# case of its group (the baseline, measured in the same run), as a ratio.
/^Benchmark/ {
  name = $1; sub(/-[0-9]+$/, "", name)
  group = name; sub(/\/.*/, "", group)
  ns = ""; bytes = ""; allocs = ""; extra = ""
  for (i = 3; i < NF; i += 2) {
    if ($(i+1) == "ns/op") ns = $i
    else if ($(i+1) == "B/op") bytes = $i
    else if ($(i+1) == "allocs/op") allocs = $i
    else extra = extra sprintf("  %s=%s", $(i+1), $i)
  }
  if (!(group in base)) { base[group] = ns; order[++n] = group; printf "\n%-48s %14s %9s %12s %10s\n", group, "ns/op", "x base", "B/op", "allocs/op" }
  printf "%-48s %14.0f %9.2f %12s %10s%s\n", name, ns, ns / base[group], bytes, allocs, extra
}
/^(ok|FAIL|PASS)/ { print }
# Tables a benchmark prints itself (markdown rows).
/^\|/ { print }
