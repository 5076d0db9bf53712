"""What to buy: one deployment option with its capacity, rate and cost (option), the search over GPUs, parallelism,
KV dtype and expert formats that recommends one (plan), a configuration's throughput-per-GPU curve (curve), the
SGLang command lines that launch it (launch), what FP8 KV buys and costs per attention backend (fp8_kv), the price
each GPU is costed at (prices) and the campaign file that measures a plan's answer (campaign_file)."""

from bench.model.advice import campaign_file, curve, format_table, fp8_kv, launch, option, plan, prices
from bench.model.advice.campaign_file import CampaignFile, for_plan
from bench.model.advice.option import HOURS_PER_MONTH, Config, Option
from bench.model.advice.plan import Plan, Question, make_plan, workload_names

__all__ = ["campaign_file", "CampaignFile", "for_plan", "format_table", "prices",
           "curve", "fp8_kv", "launch", "option", "plan", "HOURS_PER_MONTH", "Config", "Option", "Plan", "Question",
           "make_plan", "workload_names"]
