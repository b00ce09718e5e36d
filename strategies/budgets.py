"""How much a search and its validation spend (one owner each).

The numbers behind ``--trials``, ``--validate-top``, ``--validate-rounds`` and the two margins
that decide which configs are measured and re-measured: used by strategies.search,
strategies.plan.top_candidates, advisor.validation.validate_rounds, advisor.recommending and the
CLI's defaults and help texts. Imports nothing, so the CLI shows them without loading the
search.
"""

from __future__ import annotations

# Trials of a sampled (TPE) search; smaller spaces are enumerated. Measured in
# strategies.search's docstring: 128 TPE trials found the exact best of a 780-candidate space in
# 3 of 3 seeds.
DEFAULT_TRIALS = 128

# Before the study, the cost model prices every candidate in memory for at most this long
# (strategies.search.screen): measured on the 2-vCPU dev host, ~0.02 ms a candidate on a
# measured profile and 2.5 ms on a 70B what-if (480 candidates in 1.2 s), against 30-80 ms for
# a study trial (its storage). A space the screen cannot finish in time is sampled by TPE.
SCREEN_S = 10.0

# The best K predicted candidates are measured with short real runs (plus the baseline).
DEFAULT_VALIDATE_TOP_K = 3

# A layout's best candidate is validated too when its 90% interval reaches the best
# prediction's (strategies.uncertainty); this fraction of the best is the fallback for
# predictions without intervals (hand-made ones).
# The cost model's errors are shared within a layout and differ between layouts (regret
# benchmark, 2-vCPU host, median signed step-time error: single -4..+4%, ddp×2 -1..+9%, fsdp×2
# -23..-18%), and one profile's single-device timing moved gpt-tiny bf16 mb 8 from 9,077 to
# 7,822 predicted tok/s between two runs: the top K of one layout can crowd out the config that
# measures fastest.
LAYOUT_MARGIN = 0.15

# Contenders within this fraction of the fastest measured config are measured again. On a
# shared host a config's throughput moves between visits far more than between the steps of one
# visit: 16 back-to-back 3-step visits of gpt-tiny bf16 mb 8 on the 2-vCPU dev host read
# 7,550-9,283 tok/s (median 9,000; each visit's own steps within 10%), so two configs measured
# once each can be 15% apart by chance alone.
TIE_MARGIN = 0.15

# Visits of a close contender in all (the first included).
DEFAULT_VALIDATE_ROUNDS = 3

# A validation visit during which other processes (and a hypervisor's steal) took at least this
# share of the host's CPU time (profilers.host_activity) is flagged in the plan's reasons: its
# speed is the moment's as much as the config's. A quarter of the host is half a core of the
# 2-vCPU dev host, the size of neighbour that moved one config's visits 7,550-9,283 tok/s
# (above); session 12's 4x validation gap ran at a load average of 2.6-3.6 there.
BUSY_HOST_SHARE = 0.25
