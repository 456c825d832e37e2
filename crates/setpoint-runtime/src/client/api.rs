//! [`Api<K>`]: the verbs on one resource, typed or dynamic.

use std::marker::PhantomData;

use bytes::Bytes;
use futures::Stream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::{
    ApiResource, Client, ClientError, DeleteParams, ListParams, Outgoing, Patch, PatchParams,
    PostParams, Undecodable, WatchEvent, WatchParams, JSON,
};

/// An untyped object: any kind, as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct DynamicObject(pub Value);

/// A page of a LIST.
#[derive(Clone, Debug)]
pub struct ObjectList<K> {
    /// The objects of this page (`items`).
    pub items: Vec<K>,
    /// The list's `metadata.resourceVersion`: the store revision the page was read at, from which a
    /// watch can continue.
    pub resource_version: String,
    /// Set when more pages remain.
    pub continue_token: Option<String>,
}

/// A LIST whose undecodable items were left out, and those items.
#[derive(Clone, Debug)]
pub(crate) struct LenientList<K> {
    pub list: ObjectList<K>,
    pub skipped: Vec<Undecodable>,
}

/// The verbs on one resource, in one namespace or across all of them.
pub struct Api<K> {
    client: Client,
    resource: ApiResource,
    namespace: Option<String>,
    /// The `Accept` header of reads (GET, LIST, WATCH).
    accept: &'static str,
    /// Watch events are decoded without `metadata.managedFields` (for informers that drop it).
    skip_managed_fields: bool,
    _k: PhantomData<fn() -> K>,
}

/// What a metadata-only [`Api`] accepts: objects as `meta.k8s.io/v1` `PartialObjectMetadata`.
const PARTIAL_METADATA: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Api {
            client: self.client.clone(),
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            accept: self.accept,
            skip_managed_fields: self.skip_managed_fields,
            _k: PhantomData,
        }
    }
}

impl<K: k8s_openapi::Resource> Api<K>
where
    K::Scope: 'static,
{
    /// Objects in one namespace.
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Api {
            client,
            resource: ApiResource::of::<K>(),
            namespace: Some(namespace.into()),
            accept: JSON,
            skip_managed_fields: false,
            _k: PhantomData,
        }
    }
    /// Objects in all namespaces (or a cluster-scoped resource).
    pub fn all(client: Client) -> Self {
        Api {
            client,
            resource: ApiResource::of::<K>(),
            namespace: None,
            accept: JSON,
            skip_managed_fields: false,
            _k: PhantomData,
        }
    }
}

impl Api<DynamicObject> {
    /// Untyped access to `resource` in one namespace (`None`: all, or cluster-scoped).
    pub fn dynamic(client: Client, resource: &ApiResource, namespace: Option<&str>) -> Self {
        Api {
            client,
            resource: resource.clone(),
            namespace: namespace.map(String::from),
            accept: JSON,
            skip_managed_fields: false,
            _k: PhantomData,
        }
    }

    /// Like [`Api::dynamic`], but reads return only each object's metadata, as
    /// `PartialObjectMetadata` (`apiVersion: meta.k8s.io/v1`), the way metadata informers
    /// read: enough for anything that follows owners, finalizers and labels, at a fraction of
    /// the memory and decoding of whole objects. Writes are unaffected.
    pub fn metadata(client: Client, resource: &ApiResource, namespace: Option<&str>) -> Self {
        Api {
            accept: PARTIAL_METADATA,
            ..Api::dynamic(client, resource, namespace)
        }
    }

    /// Whether reads return metadata only (see [`Api::metadata`]).
    pub fn is_metadata(&self) -> bool {
        self.accept == PARTIAL_METADATA
    }
}

fn with_query(path: String, q: String) -> String {
    if q.is_empty() {
        path
    } else {
        format!("{path}?{q}")
    }
}

/// Decodes a response body straight into `K`, without a JSON tree in between.
fn decode_bytes<K: DeserializeOwned>(b: &[u8]) -> Result<K, ClientError> {
    serde_json::from_slice(b).map_err(|e| ClientError::Decode(e.to_string()))
}

/// An answer's `metadata` without `managedFields`; the rest is passed over unbuilt.
fn decode_metadata(b: &[u8]) -> Result<ObjectMeta, ClientError> {
    #[derive(serde::Deserialize)]
    struct MetadataOnly {
        #[serde(default)]
        metadata: ObjectMeta,
    }
    let text = std::str::from_utf8(b).map_err(|e| ClientError::Decode(e.to_string()))?;
    super::skip_managed::from_str::<MetadataOnly>(text)
        .map(|m| m.metadata)
        .map_err(|e| ClientError::Decode(e.to_string()))
}

/// Whether a serialized object names its `apiVersion` and `kind` (read without building
/// anything).
fn names_its_type(json: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct TypeMeta {
        #[serde(rename = "apiVersion")]
        api_version: Option<serde::de::IgnoredAny>,
        kind: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<TypeMeta>(json)
        .is_ok_and(|t| t.api_version.is_some() && t.kind.is_some())
}

impl<K: DeserializeOwned + Serialize + Send + 'static> Api<K> {
    /// The resource this handle talks to.
    pub fn resource(&self) -> &ApiResource {
        &self.resource
    }
    /// The namespace (None: all namespaces or cluster-scoped).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn object_path(&self, name: &str, sub: Option<&str>) -> String {
        self.resource
            .object_path(self.namespace.as_deref(), name, sub)
    }

    fn body<T: Serialize>(&self, obj: &T) -> Result<Bytes, ClientError> {
        let json = serde_json::to_vec(obj).map_err(|e| ClientError::Decode(e.to_string()))?;
        if names_its_type(&json) {
            return Ok(Bytes::from(json));
        }
        // Fill apiVersion/kind: typed structs from k8s-openapi serialize them, user types may not.
        let mut v = serde_json::to_value(obj).map_err(|e| ClientError::Decode(e.to_string()))?;
        if let Some(m) = v.as_object_mut() {
            m.entry("apiVersion")
                .or_insert_with(|| self.resource.api_version().into());
            m.entry("kind")
                .or_insert_with(|| self.resource.kind.clone().into());
        }
        Ok(Bytes::from(
            serde_json::to_vec(&v).map_err(|e| ClientError::Decode(e.to_string()))?,
        ))
    }

    /// GET one object.
    pub async fn get(&self, name: &str) -> Result<K, ClientError> {
        decode_bytes(
            &self
                .client
                .request_bytes(Outgoing::get(&self.object_path(name, None), self.accept))
                .await?,
        )
    }

    /// GET one object, `None` if it does not exist.
    pub async fn get_opt(&self, name: &str) -> Result<Option<K>, ClientError> {
        match self.get(name).await {
            Ok(k) => Ok(Some(k)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One LIST page.
    pub async fn list(&self, params: &ListParams) -> Result<ObjectList<K>, ClientError> {
        let mut failed = None;
        let page = self
            .list_page(params, &mut |u| {
                failed.get_or_insert(u);
            })
            .await?;
        match failed {
            Some(u) => Err(ClientError::Decode(u.error)),
            None => Ok(page),
        }
    }

    /// Every page of a LIST, followed to the end, leaving out (and returning) the items that
    /// do not decode as `K`: one bad object does not hide the others.
    pub(crate) async fn list_all_lenient(
        &self,
        params: &ListParams,
    ) -> Result<LenientList<K>, ClientError> {
        let mut skipped = Vec::new();
        let mut p = params.clone();
        let mut first = self.list_page(&p, &mut |u| skipped.push(u)).await?;
        while let Some(c) = first.continue_token.take() {
            p.continue_token = Some(c);
            let next = self.list_page(&p, &mut |u| skipped.push(u)).await?;
            first.items.extend(next.items);
            first.continue_token = next.continue_token;
        }
        Ok(LenientList {
            list: first,
            skipped,
        })
    }

    /// One LIST page; each item that does not decode goes to `undecodable` instead.
    async fn list_page(
        &self,
        params: &ListParams,
        undecodable: &mut (dyn FnMut(Undecodable) + Send),
    ) -> Result<ObjectList<K>, ClientError> {
        let path = with_query(
            self.resource.collection_path(self.namespace.as_deref()),
            params.query(),
        );
        let mut v: Value = decode_bytes(
            &self
                .client
                .request_bytes(Outgoing::get(&path, self.accept))
                .await?,
        )?;
        let resource_version = v
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let continue_token = v
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(String::from);
        let items = match v.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) => items
                .into_iter()
                .filter_map(|mut i| {
                    // List items may omit their type; fill it so typed decoding works.
                    if let Some(m) = i.as_object_mut() {
                        m.entry("apiVersion")
                            .or_insert_with(|| self.resource.api_version().into());
                        m.entry("kind")
                            .or_insert_with(|| self.resource.kind.clone().into());
                    }
                    // Decoded from a borrow, so a failure can still say which object it was.
                    K::deserialize(&i)
                        .map_err(|e| undecodable(Undecodable::of(&i, e)))
                        .ok()
                })
                .collect(),
            _ => Vec::new(),
        };
        Ok(ObjectList {
            items,
            resource_version,
            continue_token,
        })
    }

    /// Every page of a LIST, followed to the end.
    pub async fn list_all(&self, params: &ListParams) -> Result<ObjectList<K>, ClientError> {
        let mut p = params.clone();
        let mut first = self.list(&p).await?;
        while let Some(c) = first.continue_token.take() {
            p.continue_token = Some(c);
            let next = self.list(&p).await?;
            first.items.extend(next.items);
            first.continue_token = next.continue_token;
        }
        Ok(first)
    }

    /// A WATCH from `resource_version` ("" = current state first, then changes).
    pub async fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> Result<impl Stream<Item = Result<WatchEvent<K>, ClientError>> + Send + 'static, ClientError>
    {
        let path = with_query(
            self.resource.collection_path(self.namespace.as_deref()),
            params.query(resource_version),
        );
        self.client
            .watch_typed(&path, self.accept, self.skip_managed_fields)
            .await
    }

    /// Like [`Api::watch`], but an event whose object does not decode as `K` is yielded as its
    /// [`Undecodable`] instead of ending the stream with an error.
    pub(crate) async fn watch_lenient(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> Result<
        impl Stream<Item = Result<WatchEvent<Result<K, Undecodable>>, ClientError>> + Send + 'static,
        ClientError,
    > {
        let path = with_query(
            self.resource.collection_path(self.namespace.as_deref()),
            params.query(resource_version),
        );
        self.client
            .watch_lenient(&path, self.accept, self.skip_managed_fields)
            .await
    }

    /// This handle, with watch events decoded without `metadata.managedFields` (never built,
    /// rather than built and dropped): what an informer that strips them watches with, and
    /// what any watcher that never reads field ownership can use to decode in about half the
    /// time.
    pub fn skipping_managed_fields(mut self) -> Self {
        self.skip_managed_fields = true;
        self
    }

    /// Sends `obj` as JSON with `method` to `path` and returns the answer undecoded.
    async fn send_object(
        &self,
        method: http::Method,
        path: &str,
        obj: &K,
    ) -> Result<Bytes, ClientError> {
        self.client
            .request_bytes(Outgoing::new(
                method,
                path,
                JSON,
                Some("application/json"),
                self.body(obj)?,
            ))
            .await
    }

    fn create_path(&self, params: &PostParams) -> String {
        with_query(
            self.resource.collection_path(self.namespace.as_deref()),
            params.query(),
        )
    }

    /// POST a new object.
    pub async fn create(&self, params: &PostParams, obj: &K) -> Result<K, ClientError> {
        let path = self.create_path(params);
        decode_bytes(&self.send_object(http::Method::POST, &path, obj).await?)
    }

    /// [`Api::create`] for callers that need no more of the created object than its metadata
    /// (name, uid, resourceVersion): only that is decoded, without `managedFields`. A
    /// controller that creates many objects spends noticeably less per write.
    pub async fn create_metadata(
        &self,
        params: &PostParams,
        obj: &K,
    ) -> Result<ObjectMeta, ClientError> {
        let path = self.create_path(params);
        decode_metadata(&self.send_object(http::Method::POST, &path, obj).await?)
    }

    /// PUT an object (its `metadata.resourceVersion`, if set, is a precondition).
    pub async fn replace(
        &self,
        name: &str,
        params: &PostParams,
        obj: &K,
    ) -> Result<K, ClientError> {
        let path = with_query(self.object_path(name, None), params.query());
        decode_bytes(&self.send_object(http::Method::PUT, &path, obj).await?)
    }

    /// PUT the status subresource.
    pub async fn replace_status(
        &self,
        name: &str,
        params: &PostParams,
        obj: &K,
    ) -> Result<K, ClientError> {
        let path = with_query(self.object_path(name, Some("status")), params.query());
        decode_bytes(&self.send_object(http::Method::PUT, &path, obj).await?)
    }

    /// [`Api::replace_status`], decoding only the answer's metadata (as
    /// [`Api::create_metadata`]): for writers that go on from their own copy, as a node agent
    /// reporting pod status does.
    pub async fn replace_status_metadata(
        &self,
        name: &str,
        params: &PostParams,
        obj: &K,
    ) -> Result<ObjectMeta, ClientError> {
        let path = with_query(self.object_path(name, Some("status")), params.query());
        decode_metadata(&self.send_object(http::Method::PUT, &path, obj).await?)
    }

    async fn patch_at(
        &self,
        name: &str,
        sub: Option<&str>,
        params: &PatchParams,
        patch: &Patch,
    ) -> Result<Bytes, ClientError> {
        let path = with_query(self.object_path(name, sub), params.query());
        let body = Bytes::from(
            serde_json::to_vec(patch.body()).map_err(|e| ClientError::Decode(e.to_string()))?,
        );
        self.client
            .request_bytes(Outgoing::new(
                http::Method::PATCH,
                &path,
                JSON,
                Some(patch.content_type()),
                body,
            ))
            .await
    }

    /// PATCH an object.
    pub async fn patch(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch,
    ) -> Result<K, ClientError> {
        decode_bytes(&self.patch_at(name, None, params, patch).await?)
    }

    /// PATCH the status subresource.
    pub async fn patch_status(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch,
    ) -> Result<K, ClientError> {
        decode_bytes(&self.patch_at(name, Some("status"), params, patch).await?)
    }

    /// GET the autoscaling/v1 Scale.
    pub async fn get_scale(&self, name: &str) -> Result<Value, ClientError> {
        self.client
            .request(
                http::Method::GET,
                &self.object_path(name, Some("scale")),
                None,
                Bytes::new(),
            )
            .await
    }

    /// PATCH the Scale.
    pub async fn patch_scale(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch,
    ) -> Result<Value, ClientError> {
        decode_bytes(&self.patch_at(name, Some("scale"), params, patch).await?)
    }

    /// DELETE an object. Returns the object as the server answered (gone, or now carrying a
    /// deletionTimestamp while finalizers or a grace period hold it).
    pub async fn delete(&self, name: &str, params: &DeleteParams) -> Result<Value, ClientError> {
        let body = Bytes::from(
            serde_json::to_vec(&params.body()).map_err(|e| ClientError::Decode(e.to_string()))?,
        );
        self.client
            .request(
                http::Method::DELETE,
                &self.object_path(name, None),
                Some("application/json"),
                body,
            )
            .await
    }

    /// POST to a subresource (e.g. `binding` of a pod).
    pub async fn create_subresource(
        &self,
        name: &str,
        subresource: &str,
        body: &Value,
    ) -> Result<Value, ClientError> {
        let b =
            Bytes::from(serde_json::to_vec(body).map_err(|e| ClientError::Decode(e.to_string()))?);
        self.client
            .request(
                http::Method::POST,
                &self.object_path(name, Some(subresource)),
                Some("application/json"),
                b,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    #[test]
    fn an_answer_can_be_read_for_its_metadata_alone() {
        let answer = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "uid": "u1", "resourceVersion": "9",
                "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let meta = decode_metadata(&serde_json::to_vec(&answer).unwrap()).unwrap();
        assert_eq!(meta.name.as_deref(), Some("web-1"));
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
        assert!(meta.managed_fields.is_none());
        // No metadata is empty metadata; a broken answer is an error, not a panic.
        assert_eq!(decode_metadata(b"{}").unwrap(), ObjectMeta::default());
        assert!(decode_metadata(b"{\"metadata\": 7}").is_err());
        assert!(decode_metadata(b"{\"metadata\": {}").is_err());
    }

    #[test]
    fn bodies_that_name_their_type_are_sent_as_serialized() {
        let pod = serde_json::to_vec(&Pod::default()).unwrap();
        assert!(names_its_type(&pod));
        for untyped in [
            json!({"metadata": {"name": "a"}}),
            json!({"apiVersion": "v1", "metadata": {}}),
            json!({"kind": "Pod"}),
            json!({"apiVersion": null, "kind": "Pod"}),
            json!({"spec": {"apiVersion": "v1", "kind": "Pod"}}),
        ] {
            let json = serde_json::to_vec(&DynamicObject(untyped.clone())).unwrap();
            assert!(!names_its_type(&json), "{untyped}");
        }
    }
}
