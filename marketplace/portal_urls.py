"""The web portal's pages (Django templates + django-htmx); the API lives under /api."""

from django.contrib.auth import views as auth_views
from django.urls import path

from inference import views as inference_views
from marketplace import views
from marketplace.throttles import ThrottledLoginView
from nodes import views as node_views
from rentals import views as rental_views
from reputation import views as reputation_views

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", ThrottledLoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("nodes/", node_views.node_list, name="node-list"),
    path("nodes/new/", node_views.node_create, name="node-create"),
    path("nodes/<int:node_id>/", node_views.node_detail, name="node-detail"),
    path("nodes/<int:node_id>/row/", node_views.node_row, name="node-row"),
    path("nodes/<int:node_id>/pause/", node_views.node_pause, name="node-pause"),
    path("nodes/<int:node_id>/resume/", node_views.node_resume, name="node-resume"),
    path("nodes/<int:node_id>/spot/", node_views.node_spot, name="node-spot"),
    path("offers/", rental_views.offer_list, name="offer-list"),
    path("offers/<int:node_id>/rent/", rental_views.rent, name="rent"),
    path("rentals/", rental_views.rental_list, name="rental-list"),
    path("rentals/<int:rental_id>/", rental_views.rental_detail, name="rental-detail"),
    path("rentals/<int:rental_id>/end/", rental_views.rental_end, name="rental-end"),
    path("keys/", inference_views.api_keys, name="api-keys"),
    path("keys/<int:key_id>/revoke/", inference_views.api_key_revoke, name="api-key-revoke"),
    path("staff/", views.staff, name="staff"),
    path("staff/providers/<int:provider_id>/standing/", reputation_views.change_standing, name="provider-standing"),
    path("reputation/", reputation_views.my_reputation, name="my-reputation"),
]
