"""Planning: the levers searched jointly with the estimator, and the plan document.

The search, the objective that picks among what fits, the levers' record, and the plan.
"""
