"""`vlmdata dashboard`: a local web page with live charts scraped from metrics endpoints."""
from vlmdata.dashboard.charts import CHARTS, Chart, Line
from vlmdata.dashboard.server import Dashboard, DashboardConfig

__all__ = ["CHARTS", "Chart", "Dashboard", "DashboardConfig", "Line"]
