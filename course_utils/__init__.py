"""Helpers for the GRPO course, in groups that show the design; each group imports only the groups before it.

``core``: the facts every other group reads; imports nothing of ours.
    ``profiles`` (hardware profiles, picked by ``COURSE_PROFILE``), ``paths`` (where files are read and written),
    ``hardware`` (the CPU's precision path, the GPU's abilities, the ``Hardware`` a run uses), ``answer_format``
    (the ``<reasoning>``/``<answer>`` layout), ``findings`` (the ``Finding`` that preflight and monitoring report),
    ``field_checks`` (config values checked against their declared types and choices), ``rehearsal`` (the GPU
    profiles changed for a CPU under ``COURSE_REHEARSAL=1``, each change said), ``speedups`` (the CPU plug-in's
    switch, the shape a function asks of it, and what its kept logits cost in memory), ``trl_internals`` (the
    private ``GRPOTrainer`` methods the lesson asks, behind TRL's version gate), ``transformers_internals`` (the
    ``Trainer``'s own checkpoint of a stopped run, behind transformers' version gate), ``machine_limits`` (the
    decoding ceiling this machine's memory bandwidth and matmul throughput set).
``lesson``: what a learner builds, notebooks 01 to 03; imports core.
    ``data`` (GSM8K read from a folder, the Hub or the sample; splits), ``formatting`` (gold answers parsed, chat
    prompts built), ``data_checks`` (calculator notes recomputed, careless parsers measured), ``token_lengths``
    (prompts and solutions in tokens), ``models`` (loading the model), ``offline_model`` (the offline model
    prepared from its GGUF file, ``make setup``), ``generation`` (greedy and sampled replies, timed),
    ``local_model`` (a GPU profile's model read from a folder, ``COURSE_MODEL_DIR``), ``tiny_qwen`` (Qwen2.5's
    architecture at toy sizes and at full size with its chat template, the stand-ins the rehearsal and
    ``make gpu-check`` load),
    ``tool_use`` (the calculator tool, GSM8K's notes as tool calls), ``rewards`` (a package: ``corrected``,
    ``classic``, ``shaping``, ``hacking``, ``weights``, ``scoring``), ``grpo`` (advantages and loss by hand),
    ``trl_grpo`` (the same numbers from the installed TRL's own ``GRPOTrainer``), ``multi_reward`` (several
    rewards made into one advantage: TRL's weighted sum and GDPO's normalise-then-sum, by hand), ``plotting``
    (the lesson's and the training runs' figures), ``evaluation_plots`` (models measured, runs diagnosed),
    ``widgets`` (the reward lab), ``environment`` (the set-up report).
``training``: a ``GRPOTrainer`` run from a profile; imports core and lesson.
    ``grpo_config`` (``GRPOConfig`` from a profile, the generation batch checked), ``config_tables`` (a config's
    fields shown, the "golden config" translated), ``lora_setup`` (LoRA from a profile), ``grpo_prompts`` (the
    training prompts), ``run`` (the model in its training dtype, the trainer), ``trained_model`` (where a run's
    result lives, saved and loaded), ``run_folder`` (the folders the course marks and alone clears, complete
    checkpoints, one run per folder), ``warm_start`` (the supervised start before GRPO),
    ``run_logs`` (a run's log history, saved, read back and compared), ``run_callbacks`` (the live
    dashboard, a run stopped at the end of a step), ``monitoring`` (the monitoring rules, the lab's "did it
    learn" numbers), ``collapse`` (a run that stopped reasoning, defined once and measured on its completions),
    ``preflight`` (checks before the first step),
    ``config_reading`` (a planned run's settings read as TRL reads them), ``preflight_memory`` (its memory check:
    the estimate from a config and a model, against the machine),
    ``model_shape`` (a model's sizes and parameter counts), ``memory`` (the memory estimate, by phase),
    ``memory_parts`` (each part of it in bytes, from ``RunSettings``),
    ``memory_measurement`` (real runs' peak memory against it), ``problem_choice`` (the problems the warm start
    solves sometimes, listed), ``lab`` (the whole lab in one call, and notebook 06's one-step runs), ``tool_lab``
    (notebook 08's run, notebook 04's with a calculator: the tool template, the warm start on traces, ``tools=``).
``evaluation``: did GRPO help, and at what cost; imports core, lesson and training.
    ``stats`` (Wilson and bootstrap intervals, the exact McNemar test, pass@k, a step's reward noise), ``metrics``
    (completions scored against gold answers), ``tables`` (models compared on the same problems), ``heldout``
    (greedy generation on held-out problems), ``sampling`` (samples drawn as training draws a group: pass@1,
    pass@k, maj@k), ``curves`` (a run's warm start and checkpoints scored), ``variants`` (GRPO's modern variants,
    GDPO's included, as ``GRPOConfig`` fields, each trained from one start), ``variant_tables`` (variant runs
    compared against the seed noise and recorded), ``reward_hack`` (a bonus the policy climbs, caught and fixed),
    ``tool_eval`` (held-out problems solved with a tool, its calls run; models compared with and without it).
``exercises``: the checks a notebook calls; imports every group above.
    ``verdicts`` (the verdict a check prints, what it hands back), ``comparison`` (a learner's function run next
    to the reference on a bank of cases), ``real_rows`` (real GSM8K rows for the case banks), one
    module a notebook (``nb00_setup``, ``nb01_grpo_concepts``, ``nb02_gsm8k_data``, ``nb03_reward_functions``,
    ``nb04_train_grpo``, ``nb05_evaluate``, ``nb06_troubleshooting``, ``nb07_grpo_variants``, ``nb08_tool_use``,
    ``nb99_cpu_speed``).
    A notebook with many checks is a package of one module a job: ``nb03_reward_functions`` holds ``trl_calls``
    (a reward called as ``GRPOTrainer`` calls it), ``case_banks`` (the cases 03.1-03.5 run on),
    ``corrected_rewards`` (03.1-03.5), ``value_questions`` (03.6-03.7) and ``own_reward`` (03.8, TRL's contract).
    ``nb04_train_grpo`` holds ``judging`` (one verdict a construct, the library's own error shown), ``machine_fit``
    (precision, run folder and learning rate, for both configs), ``run_fields`` (every config field classed by
    whether it changes the run), ``grpo_config_check`` (04.1),
    ``lora_config_check`` (04.2), ``sft_config_check`` (04.3), ``grpo_trainer_check`` (04.4), ``value_questions``
    (04.5-04.7) and ``generation_batch_check`` (04.8). ``nb08_tool_use`` holds ``trace_check`` (08.1),
    ``isolated_calls`` (a function run on inputs in a child process stopped when one runs too long),
    ``calculator_check`` (08.2), ``tool_reward_check`` (08.3), ``trainer_check`` (08.4) and ``value_questions``
    (08.5).
``cpu_speed``: the CPU plug-in, a side branch the lesson does not stand on; imports core only, and no module of the
    package imports it: training and evaluation take it from their caller (``speedups=cpu_speed``, a visible line
    in a notebook or a script; ``core.speedups`` holds its switch and the shape they ask of it).
    ``packed_linear`` (linear layers packed for decoding), ``group_generation`` (a GRPO group sampled in fewer
    passes, from: ``prompt_cache`` (the prompt read once per group), ``adapters`` (LoRA beside or merged into packed
    weights), ``lean_decoder`` (a decoder layer in fewer calls), ``attention`` (one token's query heads stacked per
    key/value head), ``sampling`` (tokens drawn by inverse CDF)), ``completion_scoring`` (completion tokens scored
    only), ``shared_prefix`` (a group's prompt read once in the training pass), ``frozen_layers`` (the frozen
    layers' output taken from sampling), ``logit_tiles`` (the output head's logits kept for the backward),
    ``cpu_allocator`` (freed blocks kept in the process), ``versions`` (the library versions it was tested with),
    ``probe`` (does the rewritten decoder layer compute what the model's computes).
``runner``: runs every notebook headless (``python -m course_utils.runner``); imports core only.
"""

__version__ = "0.1.0"
