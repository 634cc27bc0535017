"""Tabulates the cuda-replay JSON reports of one GPU run (model, balloon, raw)."""
import json, os, sys

root = sys.argv[1]

def load(kind):
    out = {}
    d = os.path.join(root, kind)
    if not os.path.isdir(d):
        return out
    for f in sorted(os.listdir(d)):
        if f.endswith('.json'):
            p = os.path.join(d, f)
            try:
                out[f[:-5]] = json.load(open(p))
            except Exception as e:
                err = open(p[:-5] + '.err').read().strip() if os.path.exists(p[:-5] + '.err') else ''
                out[f[:-5]] = {'error': (err or str(e))[:200]}
    return out

def lat(r, k):
    l = r.get('latency_us', {}).get(k, {})
    return f"{l.get('p50', 0):.1f}/{l.get('p99', 0):.1f}" if l.get('count') else '-'

MiB = 2**20
print('== model mode (reserved agreement at every segment event; latency p50/p99 us)')
print(f"{'trace':26} {'config':34} {'cap':>6} {'agree':>11} {'maxdiff':>8} {'oom real/sim':>14} {'verify':>12} {'alloc':>11} {'free':>11} {'map':>11} {'unmap':>11} {'leak':>5}")
allk = {}
for n, r in load('model').items():
    if 'error' in r:
        print(f"{n:26} ERROR {r['error']}")
        continue
    a = r['reserved_agreement']; v = r.get('verify_data') or {}
    o = r['oom']
    cap = f"{r['capacity_bytes']/2**30:.1f}G" if r['capacity_bytes'] else '-'
    print(f"{n:26} {r['config'][:34]:34} {cap:>6} {a['events_equal']:>5}/{a['events_compared']:<5} {a['max_abs_diff_bytes']/MiB:>7.0f}M {str(o['real_event_index']):>6}/{str(o['simulated_event_index']):<7} {v.get('mismatches','-')!s:>3}/{v.get('blocks_checked','-')!s:<8} {lat(r,'alloc'):>11} {lat(r,'free'):>11} {lat(r,'map'):>11} {lat(r,'unmap'):>11} {r['leaked_bytes']:>5}")
    for k, l in r['latency_us'].items():
        allk.setdefault(k, []).append(l)
print()
print('== balloon = the trace cap (the driver itself refuses); first OOM and first device refusal, real vs simulated')
for n, r in load('balloon').items():
    if 'error' in r:
        print(f"{n:26} ERROR {r['error']}")
        continue
    print(f"{n:26} free left {r['balloon_free_bytes']} B  oom real {r['oom']['real_event_index']} sim {r['oom']['simulated_event_index']}  first refusal real {r['first_refusal']['real_event_index']} sim {r['first_refusal']['simulated_event_index']}  agree {r['reserved_agreement']['events_equal']}/{r['reserved_agreement']['events_compared']}  driver refusal {r.get('driver_refusal')}  leak {r['leaked_bytes']}")
    for note in r.get('notes', []):
        print(f"{'':26} note: {note}")
print()
print('== raw mode (every request a cuMemAlloc): predicted device usage vs real cuMemGetInfo delta')
for n, r in load('raw').items():
    if 'error' in r:
        print(f"{n:26} ERROR {r['error']}")
        continue
    p = r.get('prediction') or {}
    a = r['reserved_agreement']; v = r.get('verify_data') or {}
    print(f"{n:26} model {p.get('model')} ops {p.get('ops_compared')} equal {a['events_equal']}/{a['events_compared']} max err {p.get('max_abs_error_bytes',0)/MiB:.1f} MiB mean err {p.get('mean_abs_error_bytes',0)/MiB:.3f} MiB peak pred {p.get('peak_predicted_bytes',0)/MiB:.1f} MiB real {p.get('peak_real_bytes',0)/MiB:.1f} MiB ({100*p.get('peak_relative_error',0):+.2f}%) alloc p50/p99 {lat(r,'alloc')} free {lat(r,'free')} verify {v.get('mismatches')}/{v.get('blocks_checked')} leak {r['leaked_bytes']}")
