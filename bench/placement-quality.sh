#!/usr/bin/env bash
# Regenerates the data and plot of docs/placement.md: R-1 of every placement
# mode on both built-in corpora (packed at their default lengths, mean over
# the GBS windows), for P in {2..64} at GBS 128 (paper Fig. 8) and for GBS in
# {32..256} at P 8 (paper Table 1), beside the lower bound and the LLN
# prediction (paper eq. 4).
#
#   bench/placement-quality.sh [path/to/libra] [output-dir]
#
# Writes <output-dir>/placement-pool-size.tsv, placement-gbs.tsv and
# placement-quality.png (default output-dir: docs/figures), and prints the
# markdown tables on standard output.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
libra="${1:-$root/build/release/tools/libra}"
out="${2:-$root/docs/figures}"
mkdir -p "$out"
corpora=(paper-256k-v1 paper-1m-v1)  # the first calibration, outlier-heavy: what docs/placement.md analyses
modes=(sampler random zigzag zigzag-swap vrsp vrsp-refine)

# One TSV row per (corpus, gbs, P): windows, CV(F), bound, LLN, then each mode's mean R-1.
summarize() {  # corpus gbs pool_size
  "$libra" place "builtin:$1" --gbs "$2" --pool-size "$3" --summary 2>/dev/null |
    awk -v c="$1" -v g="$2" -v p="$3" -v modes="${modes[*]}" '
      /^# source/ { for (i = 1; i <= NF; ++i) { if ($i == "windows") w = $(i + 1); if ($i == "CV(F)") cv = $(i + 1) } }
      /^(vrsp|sampler|random|zigzag|zigzag-swap|vrsp-refine) / { r[$1] = $2; bound = $4 }
      /^lln / { lln = $2 }
      END {
        n = split(modes, m, " ");
        printf "%s\t%d\t%d\t%d\t%s\t%s\t%s", c, g, p, w, cv, bound, lln;
        for (i = 1; i <= n; ++i) printf "\t%s", r[m[i]];
        printf "\n";
      }'
}

header="corpus\tgbs\tpool_size\twindows\tcv\tbound\tlln"
for m in "${modes[@]}"; do header+="\t$m"; done

{
  echo -e "$header"
  for c in "${corpora[@]}"; do
    for p in 2 4 8 16 32 64; do summarize "$c" 128 "$p"; done
  done
} > "$out/placement-pool-size.tsv"

{
  echo -e "$header"
  for c in "${corpora[@]}"; do
    for g in 32 64 128 256; do summarize "$c" "$g" 8; done
  done
} > "$out/placement-gbs.tsv"

# Columns: 1 corpus 2 gbs 3 P 4 windows 5 cv 6 bound 7 lln 8 sampler 9 random
# 10 zigzag 11 zigzag-swap 12 vrsp 13 vrsp-refine.
gnuplot <<EOF
set terminal pngcairo size 1400,560 font "sans,11"
set output "$out/placement-quality.png"
set datafile separator "\t"
set multiplot layout 1,2 title "Inter-pool imbalance R-1 at GBS 128 (mean over windows; libra builtin corpora)"
set logscale xy
set xtics (2, 4, 8, 16, 32, 64)
set xlabel "pool size P"
set ylabel "R - 1"
set yrange [1e-5:5]
set format y "10^{%T}"
set key bottom left font ",9"
set grid
do for [c in "paper-256k-v1 paper-1m-v1"] {
  set title "builtin:".c font ",12"
  paper_random = (c eq "paper-256k-v1") ? 1.077 : 0.525
  paper_vrsp = (c eq "paper-256k-v1") ? 0.0050 : 0.0066
  set label 1 at 8, paper_random "" point pt 6 ps 2.5 lc rgb "black" front
  set label 2 at 8, paper_vrsp "" point pt 6 ps 2.5 lc rgb "red" front
  plot "$out/placement-pool-size.tsv" using (stringcolumn(1) eq c ? \$3 : NaN):8 with linespoints lw 2 title "sampler", \
       "" using (stringcolumn(1) eq c ? \$3 : NaN):9 with linespoints lw 2 lc rgb "black" title "random", \
       "" using (stringcolumn(1) eq c ? \$3 : NaN):7 with lines dt 2 lw 2 lc rgb "gray40" title "LLN eq. 4 (random)", \
       "" using (stringcolumn(1) eq c ? \$3 : NaN):10 with linespoints lw 2 title "zigzag", \
       "" using (stringcolumn(1) eq c ? \$3 : NaN):11 with linespoints lw 2 title "zigzag-swap", \
       "" using (stringcolumn(1) eq c ? \$3 : NaN):12 with linespoints lw 2 lc rgb "red" title "vrsp", \
       "" using (stringcolumn(1) eq c ? \$3 : NaN):13 with linespoints lw 2 lc rgb "dark-green" title "vrsp-refine", \
       "" using (stringcolumn(1) eq c ? \$3 : NaN):6 with lines dt 3 lw 3 lc rgb "blue" title "lower bound", \
       NaN with points pt 6 ps 2 lc rgb "black" title "paper: random at P=8", \
       NaN with points pt 6 ps 2 lc rgb "red" title "paper: VRSP at P=8"
}
unset multiplot
EOF

# Markdown tables for docs/placement.md.
table() {  # file key-column-title key-column
  awk -F'\t' -v title="$2" -v key="$3" 'NR == 1 { next } {
    if ($1 != last) {
      printf "\n**%s** (CV of F %s)\n\n| %s | windows | sampler | random | LLN eq. 4 | zigzag | zigzag-swap | vrsp | vrsp-refine | lower bound |\n|---|---|---|---|---|---|---|---|---|---|\n", $1, $5, title;
      last = $1
    }
    printf "| %s | %s | %.4f | %.4f | %.4f | %.4f | %.4f | %.5f | %.5f | %.5f |\n", $key, $4, $8, $9, $7, $10, $11, $12, $13, $6
  }' "$1"
}
echo "### R-1 by pool size, GBS 128"
table "$out/placement-pool-size.tsv" P 3
echo
echo "### R-1 by GBS, P 8"
table "$out/placement-gbs.tsv" GBS 2
