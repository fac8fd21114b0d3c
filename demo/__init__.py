"""The demo: a stand-in model, demo and review agents, the demo sweep and its
reference checker, and the commands that launch them (``tco_demo_campaign``,
``tco_sweep_review``, ``tco_demo_users``).

Nothing here is needed by a site: it shows tco working end to end on the dev
cluster without a real model API. The agents and the stand-in model import no
Django (they run inside sandboxes on execution hosts); the commands launch
through ``dashboards.launch``, the same service as the launch form.
"""
