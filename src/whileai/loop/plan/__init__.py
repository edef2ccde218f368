"""What a run will do, resolved once before anything loads: the config (``config``), the run plan and its
defaults table (``run_plan``), the rules for empty settings (``rules``) and the checks (``checks``)."""
