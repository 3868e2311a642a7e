#!/usr/bin/env bash
# The host backend's run-time SIMD levels, checked in the machine code of the given binaries
# (host_passes.hpp, detail/config.hpp): every AVX2 and AVX-512 entry point has its whole pass inlined (it
# calls or jumps to nothing but memcpy/memset, so no vector argument crosses between code built for
# different instruction sets), each clears the vector registers' upper halves (vzeroupper: at -O1,
# -Og and -Os g++ leaves that out, and the caller's SSE code then runs slower), AVX2 entries use no zmm
# register, and the scalar path uses no ymm or zmm, so a CPU without AVX runs it (unless built with
# -march=native: first argument "native").
set -u
build=$1
shift
status=0
for binary in "$@"; do
  report=$(objdump -d --no-show-raw-insn -C "$binary" | awk -v build="$build" '
    function leave() {
      if ((kind == "avx2" || kind == "avx512") && !zeroed) { print "FAIL: " name " has no vzeroupper"; bad++ }
    }
    /^[0-9a-f]+ </ {
      leave()
      kind = ""
      zeroed = 0
      if ($0 ~ /run_host_chunk_avx512</) kind = "avx512"
      else if ($0 ~ /run_host_chunk_avx2</) kind = "avx2"
      else if ($0 ~ /run_host_chunk<mpopt::detail::scalar_lanes/) kind = "scalar"
      if (kind != "") { entries[kind]++; name = $0 }
      next
    }
    kind == "" { next }
    # A call or a jump (a tail call) to the start of another function; jumps within the entry
    # show as <entry+0x...>.
    kind != "scalar" && /\t(call|jmp)/ && />$/ && !/\+0x[0-9a-f]+>$/ && !/<(memcpy|memset)@plt>$/ {
      print "FAIL: " name " leaves for " substr($0, index($0, "<")); bad++
    }
    /\tvzeroupper/ { zeroed = 1 }
    kind == "avx2" && /zmm/ { print "FAIL: " name " uses zmm: " $0; bad++ }
    kind == "scalar" && build != "native" && /[yz]mm/ { print "FAIL: " name " uses a vector register: " $0; bad++ }
    END {
      leave()
      printf "%d avx512, %d avx2 and %d scalar pass entries checked\n", entries["avx512"], entries["avx2"], entries["scalar"]
      if (entries["avx2"] == 0 || entries["avx512"] == 0 || entries["scalar"] == 0) { print "FAIL: a level has no entries"; bad++ }
      exit bad > 0
    }')
  rc=$?
  echo "$(basename "$binary"): $report" | head -20
  [ $rc -eq 0 ] || status=1
done
exit $status
