from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from inference import api as inference_api
from marketplace import health
from marketplace.api import AuthTokenView
from marketplace.metrics import metrics_view
from nodes import api as nodes_api
from preemption import api as preemption_api
from rentals import api as rentals_api
from rentals import render_api
from reputation import api as reputation_api


api_v1 = [
    path("auth/token", AuthTokenView.as_view()),
    path("nodes", nodes_api.NodeListView.as_view()),
    path("nodes/<int:node_id>", nodes_api.NodeDetailView.as_view()),
    path("nodes/<int:node_id>/pause", nodes_api.NodePauseView.as_view()),
    path("nodes/<int:node_id>/resume", nodes_api.NodeResumeView.as_view()),
    path("nodes/<int:node_id>/reclaims", nodes_api.NodeReclaimsView.as_view()),
    path("offers", rentals_api.OfferListView.as_view()),
    path("rentals", rentals_api.RentalListView.as_view()),
    path("rentals/<int:rental_id>", rentals_api.RentalDetailView.as_view()),
    path("rentals/<int:rental_id>/end", rentals_api.RentalEndView.as_view()),
    path("api-keys", inference_api.ApiKeyListView.as_view()),
    path("api-keys/<int:key_id>", inference_api.ApiKeyDetailView.as_view()),
    path("render-jobs", render_api.RenderJobListView.as_view()),
    path("render-jobs/<int:job_id>", render_api.RenderJobDetailView.as_view()),
    path("reputation", reputation_api.MyReputationView.as_view()),
    path("staff/providers", reputation_api.StaffProviderListView.as_view()),
    path("staff/providers/<int:provider_id>/delist", reputation_api.StaffDelistView.as_view()),
    path("staff/providers/<int:provider_id>/reinstate", reputation_api.StaffReinstateView.as_view()),
    path("agent/hello", nodes_api.AgentHelloView.as_view()),
    path("agent/heartbeat", nodes_api.AgentHeartbeatView.as_view()),
    path("agent/workers", nodes_api.AgentWorkersView.as_view()),
    path("agent/commands/<uuid:command_id>/ack", nodes_api.AgentCommandAckView.as_view()),
    *preemption_api.api_v1_paths,  # the cloud webhooks, agent/notices, pools, economics
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("meta/<str:notice_token>/latest/meta-data/spot/instance-action", rentals_api.instance_action),
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("metrics", metrics_view),
    *[path(f"api/v1/{p.pattern}", p.callback) for p in api_v1],
    path("insights/", include("preemption.urls")),
    # The web portal (sign-up, My nodes, Offers, My rentals, staff).
    path("", include("marketplace.portal_urls")),
]
