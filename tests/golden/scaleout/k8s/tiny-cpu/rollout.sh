#!/bin/sh
# Send PERCENT of tiny's traffic (gRPC and HTTP) to the speculative track, the rest to the baseline.
#   ./rollout.sh 10     canary
#   ./rollout.sh 100    all speculative
#   ./rollout.sh 0      roll back: all traffic on the baseline at once (both tracks stay warm)
# Written by `trtspec deploy k8s`; needs kubectl and Istio (VirtualService tiny).
set -eu
p="${1:-}"
case "$p" in
  ''|*[!0-9]*) echo "usage: $0 PERCENT   (an integer 0-100: the speculative track's share)" >&2; exit 2 ;;
esac
if [ "$p" -gt 100 ]; then echo "PERCENT must be 0-100, got $p" >&2; exit 2; fi
b=$((100 - p))
exec kubectl -n default patch virtualservice tiny --type=json -p "[{\"op\":\"replace\",\"path\":\"/spec/http/0/route/0/weight\",\"value\":$b},{\"op\":\"replace\",\"path\":\"/spec/http/0/route/1/weight\",\"value\":$p},{\"op\":\"replace\",\"path\":\"/spec/http/1/route/0/weight\",\"value\":$b},{\"op\":\"replace\",\"path\":\"/spec/http/1/route/1/weight\",\"value\":$p}]"
