"""Data quality: is what a run stored as good as what the spider stored before?

A spider can keep "succeeding" while its site changed under it: empty brands, missing dates,
half the products. Each run counts, where items are stored, how many had each field filled
(:mod:`.coverage`) and how its responses went; the nodes' counts are summed in Redis like the run's other figures
(:mod:`.figures`). When a run finishes, :mod:`.checks` compares it with the spider's last
finished runs, :mod:`.report` renders the result, :mod:`.store` keeps it in Postgres
(``run_quality``, ``run_checks``) and :mod:`.monitor` is the extension that does all this.
"""
