"""ray.experimental: only the state API that verl/single_controller/ray/base.py imports."""
