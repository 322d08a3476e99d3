# Load balancer for the `scale` profile: Debian's nginx on the same base image as the server (no extra
# registry image is needed). Runs as an unprivileged user on port 8080.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/* \
 && nginx -v
COPY nginx.conf /etc/nginx/nginx.conf
USER www-data
EXPOSE 8080
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
