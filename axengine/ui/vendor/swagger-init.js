// Starts Swagger UI on the API's own OpenAPI document (a file, not an inline script:
// the page's Content-Security-Policy allows scripts from this origin only).
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
